"""Hugging Face (PyTorch CPU) as a benchmark peer in another Python, one timed run per request.

    python -m experiments.benchmarks.hf_peer train --dtype float32 --batch 16 --seq 256
    python -m experiments.benchmarks.hf_peer generate --checkpoint DIR --batches FILE --threads 1

For a benchmark run under a Python without PyTorch's CPU wheel (on Python 3.13
PyPI's `torch` is the CUDA build, and the 3.13 venv has none): the benchmark
starts this worker in an interpreter that has torch (`peer_process.hf_python()`:
$HF_PYTHON, else pyenv's 3.11.7) through `peer_process.PeerProcess` and
alternates its own calls with the worker's, as it would with an in-process peer.

train: `learner_step.make_hf_step` (transformers Qwen3ForCausalLM + torch AdamW)
on the same demo shape and tokens `learner_step` builds (RandomState(0)); each
reply also carries the step's process CPU seconds. generate: the HF folder at
DIR, `decode.hf_generate` over each batch of FILE (JSON: a list of
{"prompts": [[ids]], "max_new": n, "seed": s}) with torch limited to `threads`
intra-op threads; each reply carries the new tokens generated.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time

from experiments.benchmarks.peer_process import refuse


def _serve(run) -> None:
    """Announce readiness with torch's and transformers' versions, then time `run()`
    per "step" line; `run` returns extra fields of the reply."""
    import torch
    import transformers

    print(
        json.dumps(
            {
                "ready": True,
                "python": sys.version.split()[0],
                "torch": torch.__version__,
                "transformers": transformers.__version__,
                "torch_threads": torch.get_num_threads(),
            }
        ),
        flush=True,
    )
    for line in sys.stdin:
        if line.strip() != "step":
            continue
        start, cpu = time.perf_counter(), time.process_time()
        extra = run() or {}
        seconds = time.perf_counter() - start
        reply = {"seconds": seconds, "cpu_s": time.process_time() - cpu, **extra}
        print(json.dumps(reply), flush=True)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("mode", choices=["train", "generate"])
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--checkpoint", default="")
    parser.add_argument("--batches", default="")
    parser.add_argument("--threads", type=int, default=0)
    args = parser.parse_args(argv)
    try:
        import torch
    except ImportError as e:
        refuse(f"{sys.executable} has no torch: {e}")
        return
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.mode == "train":
        import numpy as np

        from experiments.benchmarks.learner_step import PRECISIONS, make_hf_step

        config = PRECISIONS[args.dtype]
        tokens = np.random.RandomState(0).randint(0, config.vocab_size, (args.batch, args.seq + 1))
        step = make_hf_step(config, tokens, autocast=args.dtype == "bfloat16")
        _serve(step)
        return
    import transformers

    from experiments.benchmarks.decode import hf_generate

    model = transformers.AutoModelForCausalLM.from_pretrained(
        args.checkpoint, dtype=torch.float32
    ).eval()
    batches = json.loads(pathlib.Path(args.batches).read_text())

    def run():
        return {
            "new_tokens": sum(
                hf_generate(model, b["prompts"], b["max_new"], b["seed"]) for b in batches
            )
        }

    _serve(run)


if __name__ == "__main__":
    main()
