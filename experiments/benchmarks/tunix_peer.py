"""Tunix 0.1.7 as a benchmark peer: its Qwen3 model's train step, or its sampler's decode.

    python -m experiments.benchmarks.tunix_peer train --dtype float32 --batch 16 --seq 256
    python -m experiments.benchmarks.tunix_peer decode --dtype float32 --batch 16 \
        --prompt-len 32 --new-tokens 128

Speaks `peer_process`'s protocol. The model is the demo Qwen3 shape (vocab 4096,
hidden 256, 4 layers, 4 heads, 2 KV heads, head_dim 64, intermediate 768, tied),
`dtype` the compute dtype over float32 parameters. Train: forward + backward +
AdamW (optax) on token cross-entropy, jitted with donated state, exactly as
`learner_step`'s own plain step. Decode: `tunix.generate.Sampler` with
temperature 1, no stop token, `new_tokens` tokens for every row.
Run it with an interpreter that has Tunix (`pip install google-tunix==0.1.7`);
without it the worker says so and the benchmark records the peer as skipped.
"""

from __future__ import annotations

import argparse

from experiments.benchmarks.peer_process import refuse, serve

DEMO = dict(
    num_layers=4,
    vocab_size=4096,
    embed_dim=256,
    hidden_dim=768,
    num_heads=4,
    head_dim=64,
    num_kv_heads=2,
    rope_theta=1_000_000,
    norm_eps=1e-6,
    use_tied_embedding=True,
)


def _model(dtype_name: str):
    import jax.numpy as jnp
    from flax import nnx
    from tunix.models.qwen3 import model as qwen3

    dtype = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}[dtype_name]
    config = qwen3.ModelConfig(**DEMO, dtype=dtype, param_dtype=jnp.float32)
    return qwen3.Qwen3(config, rngs=nnx.Rngs(0)), config


def train(args) -> None:
    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax
    from flax import nnx

    model, _ = _model(args.dtype)
    optimizer = nnx.Optimizer(model, optax.adamw(1e-4), wrt=nnx.Param)
    graphdef, state = nnx.split((model, optimizer))
    tokens = np.random.RandomState(0).randint(0, DEMO["vocab_size"], (args.batch, args.seq + 1))
    ids, targets = jnp.asarray(tokens[:, :-1]), jnp.asarray(tokens[:, 1:])
    positions = jnp.broadcast_to(jnp.arange(args.seq), ids.shape)
    mask = jnp.broadcast_to(
        jnp.tril(jnp.ones((args.seq, args.seq), bool)), (args.batch,) + (args.seq,) * 2
    )

    def step(state):
        model, optimizer = nnx.merge(graphdef, state)

        def loss_fn(model):
            logits, _ = model(ids, positions, None, mask)
            return optax.softmax_cross_entropy_with_integer_labels(logits, targets).mean()

        loss, grads = nnx.value_and_grad(loss_fn)(model)
        optimizer.update(model, grads)
        return nnx.state((model, optimizer)), loss

    jitted = jax.jit(step, donate_argnums=0)
    holder = {"state": state}

    def run():
        holder["state"], loss = jitted(holder["state"])
        loss.block_until_ready()

    run()
    serve(
        run,
        {"peer": "tunix", "task": "train", "dtype": args.dtype, "compiles": jitted._cache_size()},
    )


class _IdTokenizer:
    """Strings of space-separated ids <-> ids; what Tunix's sampler needs of a tokenizer."""

    def __init__(self, vocab: int):
        self.vocab = vocab

    def encode(self, text, **_):
        return [int(t) for t in text.split()]

    def decode(self, ids, **_):
        return " ".join(str(int(i)) for i in ids)

    def bos_id(self):
        return 1

    def eos_id(self):
        return 2

    def pad_id(self):
        return 0


def decode(args) -> None:
    import numpy as np
    from tunix.generate import sampler as sampler_lib

    model, config = _model(args.dtype)
    cache = sampler_lib.CacheConfig(
        cache_size=2 * (args.prompt_len + args.new_tokens),  # the sampler pads prompts
        num_layers=config.num_layers,
        num_kv_heads=config.num_kv_heads,
        head_dim=config.head_dim,
    )
    sampler = sampler_lib.Sampler(model, _IdTokenizer(DEMO["vocab_size"]), cache)
    rng = np.random.default_rng(0)
    prompts = [
        " ".join(str(t) for t in rng.integers(3, 4000, args.prompt_len)) for _ in range(args.batch)
    ]
    state = {"seed": 0}

    def run():
        state["seed"] += 1
        out = sampler(
            prompts,
            max_generation_steps=args.new_tokens,
            max_prompt_length=args.prompt_len,
            temperature=1.0,
            top_p=1.0,
            top_k=None,
            eos_tokens=[],
            seed=state["seed"],
        )
        return {"new_tokens": int(sum(len(t) for t in out.tokens))}

    run()
    run()
    serve(run, {"peer": "tunix", "task": "decode", "dtype": args.dtype})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("task", choices=["train", "decode"])
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=128)
    args = parser.parse_args()
    try:
        import tunix  # noqa: F401
    except ImportError as e:
        refuse(f"Tunix is not installed in this interpreter ({e}); pip install google-tunix==0.1.7")
        return
    {"train": train, "decode": decode}[args.task](args)


if __name__ == "__main__":
    main()
