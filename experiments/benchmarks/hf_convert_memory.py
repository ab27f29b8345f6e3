"""Peak host memory while loading and saving a ~1B-parameter Hugging Face Qwen3 checkpoint.

A synthetic bfloat16 checkpoint (random weights, sharded safetensors + index) is
written once; then each phase runs in its own subprocess so one phase's peak
cannot hide another's:
  load: load_hf_checkpoint(dtype=bfloat16)       peak RSS during the load
  save: save_hf_checkpoint of the loaded model   peak RSS during the save only
        (the kernel's peak-RSS counter is reset after loading, via /proc/self/clear_refs)
Reported per phase: peak RSS / checkpoint bytes, both for the whole process and
above the process's RSS before the phase (Python + JAX + transformers imports).
The peer figure is transformers' own `from_pretrained` of the same checkpoint
(bf16, CPU), measured the same way; note that transformers memory-maps the
safetensors files, so its untouched weights are not resident and its RSS is not
the size of a usable in-memory model. Target: ours <= 1.25 x checkpoint size.

Run: python -m experiments.benchmarks.hf_convert_memory [--dir /tmp/qwen3_1b]
"""

from __future__ import annotations

import argparse
import json
import pathlib
import shutil
import subprocess
import sys

import numpy as np

from experiments.benchmarks import common

# ~0.98B parameters: 18 layers at hidden 2048 / intermediate 5632, untied 32k vocab.
SYNTHETIC = dict(
    vocab_size=32768,
    hidden_size=2048,
    intermediate_size=5632,
    num_hidden_layers=18,
    num_attention_heads=16,
    num_key_value_heads=8,
    head_dim=128,
    tie_word_embeddings=False,
    max_position_embeddings=4096,
)
SHARD_BYTES = 500 * 1024**2


def _status_kb(field: str) -> int:
    for line in pathlib.Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def _reset_peak() -> None:
    """Make VmHWM (peak RSS) restart from the current RSS (Linux >= 4.0)."""
    pathlib.Path("/proc/self/clear_refs").write_text("5")


def write_synthetic(folder: pathlib.Path) -> int:
    """Write the synthetic checkpoint tensor by tensor; returns its tensor bytes."""
    import jax.numpy as jnp
    import ml_dtypes
    from flax import nnx

    from orchestra_jax.models import hf_checkpoint
    from orchestra_jax.models import safetensors_stream as st
    from orchestra_jax.models.qwen3.model import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(**SYNTHETIC, param_dtype=jnp.bfloat16, dtype=jnp.bfloat16)
    abstract = nnx.eval_shape(lambda: Qwen3ForCausalLM(config, rngs=nnx.Rngs(0)))
    state = nnx.state(abstract)
    flat = dict(nnx.to_flat_state(state))
    rng = np.random.default_rng(0)
    specs = []
    for key, name, _, transpose in hf_checkpoint.param_entries(state, scanned=False):
        shape = tuple(reversed(flat[key].shape)) if transpose else tuple(flat[key].shape)

        def produce(shape=shape):
            return (rng.standard_normal(shape, np.float32) * 0.02).astype(ml_dtypes.bfloat16)

        specs.append(st.TensorSpec(name, shape, np.dtype(ml_dtypes.bfloat16), produce))
    folder.mkdir(parents=True, exist_ok=True)
    st.write_checkpoint(folder, specs, SHARD_BYTES)
    (folder / "config.json").write_text(json.dumps(config.to_hf_dict(), indent=2))
    return sum(s.nbytes for s in specs)


def phase(name: str, folder: pathlib.Path) -> dict:
    """Run one phase in this (fresh) process; returns RSS figures in bytes."""
    import jax.numpy as jnp

    if name == "hf_load":  # torch + transformers only where used: they add ~150 MB of RSS.
        import torch
        import transformers

    from orchestra_jax.models.hf_checkpoint import load_hf_checkpoint, save_hf_checkpoint

    if name == "save":
        model, config = load_hf_checkpoint(folder, dtype=jnp.bfloat16)
    _reset_peak()
    before = _status_kb("VmRSS") * 1024
    if name == "load":
        model, _ = load_hf_checkpoint(folder, dtype=jnp.bfloat16)
    elif name == "save":
        save_hf_checkpoint(
            model, config, folder.parent / (folder.name + "_saved"), max_shard_size=SHARD_BYTES
        )
    elif name == "hf_load":
        model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16)
    else:
        raise ValueError(f"unknown phase {name!r}")
    return {"rss_before_bytes": before, "peak_rss_bytes": _status_kb("VmHWM") * 1024}


def main(folder: pathlib.Path, keep: bool) -> None:
    size = write_synthetic(folder)
    results = {}
    try:
        for name in ("load", "save", "hf_load"):
            out = (
                subprocess.run(
                    [
                        sys.executable,
                        "-m",
                        "experiments.benchmarks.hf_convert_memory",
                        "--phase",
                        name,
                        "--dir",
                        str(folder),
                    ],
                    check=True,
                    capture_output=True,
                    text=True,
                )
                .stdout.strip()
                .splitlines()[-1]
            )
            r = json.loads(out)
            r["peak_over_checkpoint"] = r["peak_rss_bytes"] / size
            r["peak_above_baseline_over_checkpoint"] = (
                r["peak_rss_bytes"] - r["rss_before_bytes"]
            ) / size
            results[name] = r
            print(name, {k: round(v, 3) if isinstance(v, float) else v for k, v in r.items()})
    finally:
        if not keep:
            shutil.rmtree(folder, ignore_errors=True)
            shutil.rmtree(folder.parent / (folder.name + "_saved"), ignore_errors=True)
    common.write_result(
        "hf_convert_memory",
        {
            "checkpoint_bytes": size,
            "checkpoint_dtype": "bfloat16",
            "num_params": size // 2,
            "config": SYNTHETIC,
            "shard_bytes": SHARD_BYTES,
            "phases": results,
            "target_peak_over_checkpoint": 1.25,
            "note": "'save' excludes the load before it (peak RSS reset)",
        },
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=pathlib.Path, default=pathlib.Path("/tmp/qwen3_1b_synthetic"))
    parser.add_argument("--phase", choices=("load", "save", "hf_load"))
    parser.add_argument("--keep", action="store_true", help="keep the checkpoint files")
    args = parser.parse_args()
    if args.phase:
        print(json.dumps(phase(args.phase, args.dir)))
    else:
        main(args.dir, args.keep)
