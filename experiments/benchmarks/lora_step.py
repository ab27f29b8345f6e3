"""LoRA GRPO against full fine-tuning: learner step time, step memory, weight-sync size.

One `Learner.train_step` (the GRPO objective of `learner_step.py`: PPO-clip over
the last 3/4 of each row, KL to the reference, global-norm clip, AdamW) on a
batch of 16 x 256 tokens, for full fine-tuning and for LoRA adapters of rank 8
and 64 on every projection (alpha = 2r), timed alternately (round robin) in one
run. Float32 weights, compute in `--dtype`; the LoRA base stays in the model's
parameter dtype (float32 here, bfloat16 in `qwen3_8b_lora`).

Shapes (`--shape`): `demo` (the learner_step shape: vocab 4096, hidden 256,
4 layers) or `qwen3_0p6b_4l` (Qwen3-0.6B's dimensions, vocab 151936, with 4
layers).

Reported per variant: median step seconds; the compiled step's memory from
XLA's own accounting (arguments + outputs - aliased + temporaries, which
holds the parameters, gradients, optimizer state and reference it takes, and
the activations), plus the device's peak bytes where the backend reports it
(GPU, TPU); trained parameters; and the weight sync a serving engine would
read: seconds and bytes to write the adapters as a PEFT folder against the
whole model as a Hugging Face folder in the compute dtype.

Run: python -m experiments.benchmarks.lora_step [--shape=demo] [--repeats=5]
"""

from __future__ import annotations

import argparse
import os
import tempfile

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from experiments.benchmarks import common
from experiments.benchmarks.learner_step import BATCH, SEQ, grpo_batch
from orchestra_jax.models.hf_checkpoint import save_hf_checkpoint
from orchestra_jax.models.lora import LoRAParam, LoRASpec
from orchestra_jax.models.peft_adapter import save_adapter
from orchestra_jax.models.qwen3.model import Qwen3Config, Qwen3ForCausalLM
from orchestra_jax.rl.learner import Learner, LearnerConfig

SHAPES = {
    "demo": lambda: Qwen3Config.preset("demo"),
    "qwen3_0p6b_4l": lambda: Qwen3Config.preset("qwen3_0p6b", num_hidden_layers=4),
}
RANKS = (0, 8, 64)  # 0: full fine-tuning


def step_bytes(learner: Learner, batch) -> int:
    """XLA's memory of the learner's compiled GRPO step for `batch` (see docstring)."""
    step = learner._build_step("grpo", 1)  # pylint: disable=protected-access
    placed = jax.tree.map(np.asarray, batch)
    args = (learner.params, learner.opt_state, learner.ref_params)
    args += (learner._frozen, placed, np.float32(1.0))  # pylint: disable=protected-access
    stats = step.lower(*args).compile().memory_analysis()
    return int(
        stats.argument_size_in_bytes
        + stats.output_size_in_bytes
        - stats.alias_size_in_bytes
        + stats.temp_size_in_bytes
    )


def folder_bytes(path: str) -> int:
    return sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path))


def sync_cost(model, config: Qwen3Config, rank: int) -> dict[str, float]:
    """Seconds and bytes of writing what a serving engine reloads after a step."""
    with tempfile.TemporaryDirectory() as tmp:
        folder = os.path.join(tmp, "sync")
        if rank:
            seconds = common.time_call(lambda: save_adapter(model, folder))
        else:
            seconds = common.time_call(
                lambda: save_hf_checkpoint(model, config, folder, dtype=config.dtype)
            )
        return {"sync_s": seconds, "sync_bytes": folder_bytes(folder)}


def main(shape: str, dtype: str, repeats: int) -> None:
    base = SHAPES[shape]().replace(dtype=jnp.dtype(dtype))
    tokens = np.random.RandomState(0).randint(0, base.vocab_size, (BATCH, SEQ + 1))
    batch = grpo_batch(base, tokens)
    learner_config = LearnerConfig(learning_rate=1e-4, kl_coef=1e-4)
    fns, rows = {}, {}
    for rank in RANKS:
        name = "full" if not rank else f"lora_r{rank}"
        spec = LoRASpec(rank=rank, alpha=2.0 * rank) if rank else None
        config = base.replace(lora=spec)
        model = Qwen3ForCausalLM(config, rngs=nnx.Rngs(0))
        learner = Learner(model, learner_config)
        kind = LoRAParam if rank else nnx.Param
        rows[name] = {
            "trained_params": sum(x.size for x in jax.tree.leaves(nnx.state(model, kind))),
            "step_bytes_xla": step_bytes(learner, batch),
            **sync_cost(model, config, rank),
        }
        fns[name] = lambda learner=learner: learner.train_step(batch)
    load_before = os.getloadavg()
    timings = common.alternate_timings(fns, repeats)
    load_after = os.getloadavg()
    stats = jax.devices()[0].memory_stats() or {}
    summary = common.summarize(timings)
    for name, row in rows.items():
        row["step_s"] = summary[name]["median_s"]
    payload = {
        "shape": shape,
        "dtype": dtype,
        "batch": [BATCH, SEQ],
        "device": str(jax.devices()[0].device_kind),
        "load_avg_before_after": [load_before, load_after],
        "peak_bytes_in_use": stats.get("peak_bytes_in_use"),
        "variants": rows,
        "timings": summary,
    }
    path = common.write_result(f"lora_step_{shape}", payload)
    for name, row in rows.items():
        print(
            f"{name:>9}: step {row['step_s']:.3f} s, XLA step memory "
            f"{row['step_bytes_xla'] / 2**20:.1f} MiB, {row['trained_params'] / 1e6:.2f}M trained, "
            f"sync {row['sync_bytes'] / 2**20:.2f} MiB in {row['sync_s']:.3f} s"
        )
    print(f"load average before/after: {load_before} / {load_after}; wrote {path}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    parser.add_argument("--shape", choices=sorted(SHAPES), default="demo")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    main(args.shape, args.dtype, args.repeats)
