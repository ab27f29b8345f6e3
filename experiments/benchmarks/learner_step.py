"""Training-step throughput: our jit Qwen3 step against Hugging Face (PyTorch CPU) and Tunix.

All run forward + backward + AdamW on the `demo` Qwen3 shape (vocab 4096,
hidden 256, 4 layers, 4 heads, 2 KV heads, head_dim 64, intermediate 768, tied)
with a batch of 16 x 256 tokens, timed alternately (round robin) in one run,
in two precisions:

* float32: everything float32.
* bfloat16: float32 parameters and optimizer state, bfloat16 compute. Ours
  multiplies bf16 operands with float32 accumulation (`models/matmul.py`);
  HF runs under `torch.autocast("cpu", torch.bfloat16)`; Tunix with
  `dtype=bfloat16`.

Steps timed per precision: `ours` (a plain cross-entropy step of the model),
`ours_train_step` (the real GRPO `Learner.train_step`: PPO-clip loss over a
loss mask on the last 3/4 of each row, advantages, rollout log-probs,
global-norm clip, AdamW; the LM head runs at loss positions only), `hf_torch`
and `tunix` (Tunix 0.1.7's Qwen3 with optax AdamW, run in the interpreter
$TUNIX_PYTHON (a venv with Tunix) as a separate process that answers one step
per request, alternating with ours; skipped, saying why, when Tunix is missing).

Reported: tokens/s of each, the ratios, and our achieved FLOP/s as a fraction of
a large jnp matmul's FLOP/s in the same precision (float32, or bf16 operands
with a float32 result), where step FLOPs = 3 x forward FLOPs and forward FLOPs =
2 x tokens x (matmul weights incl. the LM head) + 4 x B x H x T^2 x D (attention).

Run: TUNIX_PYTHON=/path/to/venv/bin/python python -m experiments.benchmarks.learner_step
[--precisions float32] [--also-python /path/to/python3.11]

Without torch in this interpreter (Python 3.13) the HF step runs in `hf_peer`'s
worker under Python 3.11's CPU torch. `--also-python` also times our
`train_step` in another interpreter (its own jax: 3.11 has jax 0.10.2) in the
same round robin, so the jax versions compare under the same load.
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from experiments.benchmarks import common
from experiments.benchmarks.peer_process import hf_python, torch_importable
from orchestra_jax.models.qwen3.model import Qwen3Config, Qwen3ForCausalLM

BATCH, SEQ = 16, 256


def step_flops(c: Qwen3Config, batch: int, seq: int) -> float:
    """Training FLOPs of one step (see module docstring)."""
    e, d, f = c.hidden_size, c.head_dim, c.intermediate_size
    attn_weights = e * d * (2 * c.num_attention_heads + 2 * c.num_key_value_heads)
    per_token = c.num_hidden_layers * (attn_weights + 3 * e * f) + e * c.vocab_size
    attention = 4 * batch * c.num_attention_heads * seq * seq * d * c.num_hidden_layers
    return 3.0 * (2.0 * batch * seq * per_token + attention)


def matmul_flops_per_s(dtype=jnp.float32, n: int = 2048, repeats: int = 5) -> float:
    """FLOP/s of an n x n x n jnp matmul with `dtype` operands and a float32 result
    (the machine's practical peak for that precision)."""
    a = jnp.asarray(np.random.RandomState(0).randn(n, n), dtype)
    mm = jax.jit(lambda x: jnp.dot(x, x, preferred_element_type=jnp.float32))
    times = common.alternate_timings({"mm": lambda: mm(a).block_until_ready()}, repeats)
    return 2.0 * n**3 / float(np.median(times["mm"]))


def jax_step_parts(config: Qwen3Config, tokens: np.ndarray):
    """(train_step, state, (ids, positions, targets)): the jitted plain cross-entropy +
    AdamW step, state donated, returning (new state, loss); its first state; its batch."""
    model = Qwen3ForCausalLM(config, rngs=nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, optax.adamw(1e-4), wrt=nnx.Param)
    graphdef, state = nnx.split((model, optimizer))
    state = jax.device_put(state, jax.devices()[0])
    ids = jax.device_put(jnp.asarray(tokens[:, :-1]))
    targets = jax.device_put(jnp.asarray(tokens[:, 1:]))
    positions = jax.device_put(jnp.broadcast_to(jnp.arange(ids.shape[1]), ids.shape))

    def step(state, ids, positions, targets):
        model, optimizer = nnx.merge(graphdef, state)

        def loss_fn(model):
            logits = model(ids, positions)
            return optax.softmax_cross_entropy_with_integer_labels(logits, targets).mean()

        loss, grads = nnx.value_and_grad(loss_fn)(model)
        optimizer.update(model, grads)
        return nnx.state((model, optimizer)), loss

    train_step = jax.jit(step, donate_argnums=0)  # state updated in place
    return train_step, state, (ids, positions, targets)


def make_jax_step(config: Qwen3Config, tokens: np.ndarray):
    """A zero-argument callable running one jitted, donated train step; and a compile counter."""
    train_step, state, (ids, positions, targets) = jax_step_parts(config, tokens)
    holder = {"state": state}

    def run():
        holder["state"], loss = train_step(holder["state"], ids, positions, targets)
        loss.block_until_ready()

    return run, train_step


def grpo_batch(config: Qwen3Config, tokens: np.ndarray):
    """A GRPO TrainBatch of `tokens` [B, T + 1]: loss on the last 3/4 of each row,
    random advantages, uniform rollout log-probs."""
    from orchestra_jax.rl.batching import TrainBatch, loss_positions

    rng = np.random.RandomState(1)
    batch, seq = tokens.shape[0], tokens.shape[1] - 1
    mask = np.zeros((batch, seq), np.float32)
    mask[:, seq // 4 :] = 1.0  # the first quarter is prompt
    train_batch = TrainBatch(
        input_ids=tokens[:, :-1].astype(np.int32),
        positions=np.broadcast_to(np.arange(seq, dtype=np.int32), (batch, seq)).copy(),
        segment_ids=np.ones((batch, seq), np.int32),
        target_ids=tokens[:, 1:].astype(np.int32),
        loss_mask=mask,
        advantages=(rng.randn(batch, 1) * mask).astype(np.float32),
        old_logprobs=(np.log(1.0 / config.vocab_size) * mask).astype(np.float32),
        loss_index=loss_positions(mask),
    )
    return train_batch


def make_learner_step(config: Qwen3Config, tokens: np.ndarray):
    """A zero-argument callable running `Learner.train_step` (GRPO objective) on a fixed batch."""
    from orchestra_jax.rl.learner import Learner, LearnerConfig

    train_batch = grpo_batch(config, tokens)
    learner = Learner(
        Qwen3ForCausalLM(config, rngs=nnx.Rngs(0)), LearnerConfig(learning_rate=1e-4, kl_coef=0.0)
    )
    return lambda: learner.train_step(train_batch), learner


def make_hf_step(config: Qwen3Config, tokens: np.ndarray, autocast: bool = False):
    """The same step in transformers + torch.optim.AdamW (float32 weights, CPU); with
    `autocast`, forward and loss under torch.autocast("cpu", bfloat16)."""
    import contextlib

    import torch
    import transformers

    torch.manual_seed(0)
    hf_config = transformers.Qwen3Config(
        **{k: v for k, v in config.to_hf_dict().items() if k not in ("architectures", "model_type")}
    )
    model = transformers.Qwen3ForCausalLM(hf_config).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.tensor(tokens[:, :-1])
    labels = torch.tensor(tokens[:, 1:])

    def run():
        context = (
            torch.autocast("cpu", dtype=torch.bfloat16) if autocast else contextlib.nullcontext()
        )
        with context:
            logits = model(input_ids=ids).logits
            loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), labels.flatten())
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return run


def with_cpu_time(fn, sink: list):
    """fn, also appending the process CPU seconds of each call to `sink`.

    On a machine shared with other jobs, CPU seconds per step are a steadier
    figure than wall time (both sides use all cores: XLA and torch intra-op threads).
    """

    def run():
        start = time.process_time()
        fn()
        sink.append(time.process_time() - start)

    return run


def _peer_fn(peer, sink: list):
    """A callable running one peer step, appending the peer's own timing to `sink`."""
    return lambda: sink.append(peer.step())


PRECISIONS = {
    "float32": Qwen3Config.preset("demo"),
    "bfloat16": Qwen3Config.preset("demo", dtype=jnp.bfloat16),
}


def remote_hf_step(name: str, cpu_sink: list, peers: list):
    """The HF step in `peer_process.hf_python()` (for an interpreter without torch): a callable
    running one step there, appending the worker's CPU seconds to `cpu_sink`; the worker
    joins `peers` (closed by the caller)."""
    from experiments.benchmarks.peer_process import PeerProcess

    python = hf_python()
    peer = PeerProcess.start(
        python,
        "experiments.benchmarks.hf_peer",
        ["train", "--dtype", name, "--batch", str(BATCH), "--seq", str(SEQ)],
    )
    if not peer.available:
        raise RuntimeError(f"HF peer in {python} did not start: {peer.reason}")
    peers.append(peer)

    def run():
        peer.step()
        cpu_sink.append(peer.last["cpu_s"])

    return run, {"python": python, **{k: v for k, v in peer.info.items() if k != "ready"}}


def serve_train_step(precision: str) -> None:
    """Worker side of `--also-python`: this interpreter's `Learner.train_step` (its jax),
    one timed step per request (`peer_process` protocol)."""
    import platform

    from experiments.benchmarks.peer_process import serve

    config = PRECISIONS[precision]
    tokens = np.random.RandomState(0).randint(0, config.vocab_size, (BATCH, SEQ + 1))
    step, _ = make_learner_step(config, tokens)
    step()
    step()
    serve(step, {"python": platform.python_version(), "jax": jax.__version__})


def main(repeats: int, precisions: list[str], also_python: str = "") -> None:
    from experiments.benchmarks.peer_process import PeerProcess, tunix_python

    tokens = None
    fns, cpu, peer_seconds, compiles, peers, skipped = {}, {}, {}, {}, [], {}
    configs = {name: PRECISIONS[name] for name in precisions}
    hf_in_process, hf_info, other_info = torch_importable(), {}, {}
    for name, config in configs.items():
        tokens = np.random.RandomState(0).randint(0, config.vocab_size, (BATCH, SEQ + 1))
        ours, jitted = make_jax_step(config, tokens)
        grpo_step, learner = make_learner_step(config, tokens)
        compiles[name] = (jitted, learner)
        for key, fn in (("ours", ours), ("ours_train_step", grpo_step)):
            cpu[f"{key}_{name}"] = []
            fns[f"{key}_{name}"] = with_cpu_time(fn, cpu[f"{key}_{name}"])
        cpu[f"hf_torch_{name}"] = []
        if hf_in_process:
            hf = make_hf_step(config, tokens, autocast=name == "bfloat16")
            fns[f"hf_torch_{name}"] = with_cpu_time(hf, cpu[f"hf_torch_{name}"])
        else:  # the same step in Python 3.11's CPU torch, alternating through a pipe
            fns[f"hf_torch_{name}"], hf_info = remote_hf_step(name, cpu[f"hf_torch_{name}"], peers)
        if also_python:  # our train_step under another interpreter's jax, side by side
            other = PeerProcess.start(
                also_python, "experiments.benchmarks.learner_step", ["--serve-train-step", name]
            )
            if not other.available:
                raise RuntimeError(f"{also_python} could not serve train_step: {other.reason}")
            peers.append(other)
            key = f"train_step_other_python_{name}"
            other_info[name] = {k: v for k, v in other.info.items() if k != "ready"}
            peer_seconds[key] = []
            fns[key] = _peer_fn(other, peer_seconds[key])
        peer = PeerProcess.start(
            tunix_python(),
            "experiments.benchmarks.tunix_peer",
            ["train", "--dtype", name, "--batch", str(BATCH), "--seq", str(SEQ)],
        )
        if peer.available:
            peers.append(peer)
            peer_seconds[f"tunix_{name}"] = []
            fns[f"tunix_{name}"] = _peer_fn(peer, peer_seconds[f"tunix_{name}"])
        else:
            skipped[f"tunix_{name}"] = peer.reason
    try:
        timings = common.alternate_timings(fns, repeats, warmup=2)
    finally:
        for peer in peers:
            peer.close()
    # The peer's own step timings (without the pipe round trip) replace the wall times.
    for key, seconds in peer_seconds.items():
        timings[key] = seconds[-repeats:]
    summary = common.summarize(timings)
    n_tokens = BATCH * SEQ
    tps = {k: n_tokens / v["median_s"] for k, v in summary.items()}
    flops = step_flops(configs["float32"], BATCH, SEQ)
    peaks = {name: matmul_flops_per_s(config.dtype) for name, config in configs.items()}
    results = {}
    for name in configs:
        r = {
            "tokens_per_s": {k[: -len(name) - 1]: v for k, v in tps.items() if k.endswith(name)},
            "matmul_peak_flops_per_s": peaks[name],
            "ours_fraction_of_matmul_peak": flops
            / summary[f"ours_{name}"]["median_s"]
            / peaks[name],
            "train_step_fraction_of_matmul_peak": flops
            / summary[f"ours_train_step_{name}"]["median_s"]
            / peaks[name],
            "train_step_over_plain": tps[f"ours_train_step_{name}"] / tps[f"ours_{name}"],
            "ratio_ours_over_hf": tps[f"ours_{name}"] / tps[f"hf_torch_{name}"],
            "ratio_train_step_over_hf": tps[f"ours_train_step_{name}"] / tps[f"hf_torch_{name}"],
            "cpu_s_per_step_median": {
                k: float(np.median(v[-repeats:])) for k, v in cpu.items() if k.endswith(name)
            },
            "plain_step_compiles": compiles[name][0]._cache_size(),
            "train_step_compiles": sum(
                f._cache_size() for f in compiles[name][1]._compiled.values()
            ),
        }
        if f"train_step_other_python_{name}" in tps:
            r["other_python"] = other_info[name]
            r["train_step_over_other_python"] = (
                tps[f"ours_train_step_{name}"] / tps[f"train_step_other_python_{name}"]
            )
        if f"tunix_{name}" in tps:
            r["ratio_ours_over_tunix"] = tps[f"ours_{name}"] / tps[f"tunix_{name}"]
        results[name] = r
    spread = {k: v["max_s"] / v["min_s"] for k, v in summary.items()}
    payload = {
        "config": "demo",
        "batch": BATCH,
        "seq_len": SEQ,
        "step_flops": flops,
        "timings": summary,
        "results": results,
        "precisions": list(configs),
        "peers_skipped": skipped,
        "hf_peer": {"python": "this process"} if hf_in_process else hf_info,
        "noise_max_over_min": spread,
        "note": "timings alternate every step in one run (round robin); the Tunix peer runs "
        "in its own process ($TUNIX_PYTHON), alternating with ours; HF bf16 = autocast",
    }
    if len(configs) == 2:
        payload["bf16_over_float32_ours"] = tps["ours_bfloat16"] / tps["ours_float32"]
    # A run of one precision is written beside the full run's record, not over it.
    name = "learner_step" if len(configs) == 2 else "learner_step_" + "_".join(configs)
    path = common.write_result(name, payload)
    for name, r in results.items():
        rates = ", ".join(f"{k} {v:,.0f}" for k, v in r["tokens_per_s"].items())
        print(
            f"{name}: {rates} tok/s | ours/HF {r['ratio_ours_over_hf']:.2f} | "
            f"{r['ours_fraction_of_matmul_peak']:.1%} of matmul peak | "
            f"train_step/plain {r['train_step_over_plain']:.2f}"
        )
    print(f"skipped: {skipped or 'none'} -> {path}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument(
        "--precisions", nargs="+", choices=list(PRECISIONS), default=list(PRECISIONS)
    )
    parser.add_argument(
        "--also-python",
        default="",
        help="another interpreter whose jax times train_step too, alternating (e.g. 3.11's)",
    )
    parser.add_argument("--serve-train-step", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_train_step:
        serve_train_step(args.serve_train_step)
    else:
        main(args.repeats, args.precisions, args.also_python)
