"""Training-step throughput: our jit Qwen3 step vs Hugging Face transformers (PyTorch CPU).

Both run forward + backward + AdamW on the `demo` Qwen3 shape (vocab 4096,
hidden 256, 4 layers, 4 heads, 2 KV heads, head_dim 64, intermediate 768, tied)
with a batch of 16 x 256 tokens, in float32, timed alternately in one process.

Three steps are timed: `ours` (a plain cross-entropy step, the model alone),
`ours_train_step` (the real GRPO `Learner.train_step`: PPO-clip loss over a
loss mask covering the last 3/4 of each row, advantages, rollout log-probs,
global-norm clip, AdamW; the LM head runs at loss positions only) and
`hf_torch` (the peer).

Reported: tokens/s of each, their ratio, and our achieved FLOP/s as a fraction
of a large jnp float32 matmul's FLOP/s on the same machine, where
step FLOPs = 3 x forward FLOPs (backward ~ 2 x forward) and forward FLOPs =
2 x tokens x (matmul weights incl. the LM head) + 4 x B x H x T^2 x D (attention).

Run: python -m experiments.benchmarks.learner_step [--repeats N]
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
from orchestra_jax.models.qwen3 import Qwen3Config, Qwen3ForCausalLM

BATCH, SEQ = 16, 256


def step_flops(c: Qwen3Config, batch: int, seq: int) -> float:
    """Training FLOPs of one step (see module docstring)."""
    e, d, f = c.hidden_size, c.head_dim, c.intermediate_size
    attn_weights = e * d * (2 * c.num_attention_heads + 2 * c.num_key_value_heads)
    per_token = c.num_hidden_layers * (attn_weights + 3 * e * f) + e * c.vocab_size
    attention = 4 * batch * c.num_attention_heads * seq * seq * d * c.num_hidden_layers
    return 3.0 * (2.0 * batch * seq * per_token + attention)


def matmul_flops_per_s(n: int = 2048, repeats: int = 5) -> float:
    """FLOP/s of an n x n x n float32 jnp matmul (the machine's practical peak)."""
    a = jnp.asarray(np.random.RandomState(0).randn(n, n), jnp.float32)
    mm = jax.jit(lambda x: x @ x)
    times = common.alternate_timings({"mm": lambda: mm(a).block_until_ready()}, repeats)
    return 2.0 * n**3 / float(np.median(times["mm"]))


def make_jax_step(config: Qwen3Config, tokens: np.ndarray):
    """A zero-argument callable running one jitted, donated train step; and a compile counter."""
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
    holder = {"state": state}

    def run():
        holder["state"], loss = train_step(holder["state"], ids, positions, targets)
        loss.block_until_ready()

    return run, train_step


def make_learner_step(config: Qwen3Config, tokens: np.ndarray):
    """A zero-argument callable running `Learner.train_step` (GRPO objective) on a fixed batch."""
    from orchestra_jax.rl.batching import TrainBatch, loss_positions
    from orchestra_jax.rl.learner import Learner, LearnerConfig

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
    learner = Learner(
        Qwen3ForCausalLM(config, rngs=nnx.Rngs(0)), LearnerConfig(learning_rate=1e-4, kl_coef=0.0)
    )
    return lambda: learner.train_step(train_batch), learner


def make_hf_step(config: Qwen3Config, tokens: np.ndarray):
    """The same step in transformers + torch.optim.AdamW (float32, CPU)."""
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
        logits = model(input_ids=ids).logits
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten())
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


def main(repeats: int) -> None:
    config = Qwen3Config.preset("demo")
    tokens = np.random.RandomState(0).randint(0, config.vocab_size, (BATCH, SEQ + 1))
    ours, jitted = make_jax_step(config, tokens)
    grpo_step, learner = make_learner_step(config, tokens)
    peer = make_hf_step(config, tokens)
    cpu = {"ours": [], "ours_train_step": [], "hf_torch": []}
    fns = {
        "ours": with_cpu_time(ours, cpu["ours"]),
        "ours_train_step": with_cpu_time(grpo_step, cpu["ours_train_step"]),
        "hf_torch": with_cpu_time(peer, cpu["hf_torch"]),
    }
    timings = common.alternate_timings(fns, repeats, warmup=2)
    summary = common.summarize(timings)
    cpu_median = {k: float(np.median(v[-repeats:])) for k, v in cpu.items()}
    n_tokens = BATCH * SEQ
    ours_tps = n_tokens / summary["ours"]["median_s"]
    grpo_tps = n_tokens / summary["ours_train_step"]["median_s"]
    peer_tps = n_tokens / summary["hf_torch"]["median_s"]
    flops = step_flops(config, BATCH, SEQ)
    peak = matmul_flops_per_s()
    achieved = flops / summary["ours"]["median_s"]
    payload = {
        "config": "demo",
        "batch": BATCH,
        "seq_len": SEQ,
        "dtype": "float32",
        "timings": summary,
        "ours_tokens_per_s": ours_tps,
        "hf_torch_tokens_per_s": peer_tps,
        "ratio_ours_over_hf": ours_tps / peer_tps,
        "ours_train_step_tokens_per_s": grpo_tps,
        "ratio_train_step_over_hf": grpo_tps / peer_tps,
        "train_step_compiles": sum(f._cache_size() for f in learner._compiled.values()),
        "cpu_s_per_step_median": cpu_median,
        "ratio_by_cpu_time": cpu_median["hf_torch"] / cpu_median["ours"],
        "step_flops": flops,
        "ours_flops_per_s": achieved,
        "hf_flops_per_s": flops / summary["hf_torch"]["median_s"],
        "matmul_flops_per_s": peak,
        "ours_fraction_of_matmul_peak": achieved / peak,
        "jit_compiles": jitted._cache_size(),
        "note": "timings alternate ours / ours_train_step / peer in one process",
    }
    path = common.write_result("learner_step", payload)
    print(
        f"ours {ours_tps:,.0f} tok/s | train_step {grpo_tps:,.0f} tok/s | "
        f"HF torch {peer_tps:,.0f} tok/s | "
        f"ratio {ours_tps / peer_tps:.2f} | {achieved / peak:.1%} of matmul peak "
        f"| by CPU time {payload['ratio_by_cpu_time']:.2f} | compiles {payload['jit_compiles']} "
        f"-> {path}"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=10)
    main(parser.parse_args().repeats)
