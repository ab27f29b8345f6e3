"""The rollout protocol: what the agent loop and the learner ask of any sampler.

Every engine (the in-process JAX sampler, the SGLang client, the scripted test
engine) is token-in/token-out: it receives prompt token ids and returns the
sampled token ids with the log-probability of each one, so training always sees
the tokens that were actually generated, never a re-tokenised text.

Log-probability convention (shared by all engines):

    logprobs[i] = log_softmax(logits_i / T)[output_ids[i]]

i.e. under the temperature-scaled distribution *before* top-p/top-k truncation
(the distribution the learner recomputes).  Greedy decoding (T = 0) reports the
log-probability under T = 1.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal, Protocol, Sequence, runtime_checkable

from orchestra_jax.registry import Registry

FinishReason = Literal["stop", "length", "abort"]
FINISH_REASONS = ("stop", "length", "abort")


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """How to sample one completion.

    temperature: 0 means greedy (argmax); otherwise logits are divided by it.
    top_p: keep the smallest set of most likely tokens whose mass reaches top_p.
    top_k: keep the k most likely tokens; -1 (or 0) keeps all.
    max_new_tokens: hard cap on generated tokens (finish reason "length").
    stop_token_ids: generation ends after emitting any of these (finish reason
      "stop"); the stop token is part of the output.
    seed: makes the sample reproducible; the same request and seed give the
      same tokens whatever else shares the batch.  None draws a fresh seed.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    max_new_tokens: int = 256
    stop_token_ids: tuple[int, ...] = ()
    seed: int | None = None

    def __post_init__(self):
        # Accept any sequence for stop ids but store a hashable tuple.
        object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in self.stop_token_ids))
        if not self.temperature >= 0.0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < -1:
            raise ValueError(f"top_k must be -1 (off) or >= 0, got {self.top_k}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if any(t < 0 for t in self.stop_token_ids):
            raise ValueError(f"stop_token_ids must be non-negative, got {self.stop_token_ids}")
        if self.seed is not None and not 0 <= self.seed < 2**63:
            raise ValueError(f"seed must be in [0, 2**63), got {self.seed}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@dataclasses.dataclass(frozen=True)
class GenerateRequest:
    """One prompt (token ids) and how to continue it."""

    input_ids: list[int]
    sampling: SamplingParams = dataclasses.field(default_factory=SamplingParams)
    request_id: str | None = None

    def __post_init__(self):
        if len(self.input_ids) == 0:
            raise ValueError("input_ids must contain at least one token")
        if any((not isinstance(t, int)) or t < 0 for t in self.input_ids):
            raise ValueError("input_ids must be non-negative ints")


@dataclasses.dataclass
class Completion:
    """What an engine generated for one request.

    output_ids: the new tokens only (not the prompt), stop token included.
    logprobs: one float per output token, see the module docstring.
    finish_reason: "stop" (a stop token), "length" (max_new_tokens or the
      context ran out) or "abort" (the engine gave up on the request).
    cached_tokens: prompt tokens whose keys/values were reused from an earlier
      request instead of recomputed (SGLang's `meta_info.cached_tokens`); 0 when
      the engine does not say.
    """

    output_ids: list[int]
    logprobs: list[float]
    finish_reason: FinishReason
    prompt_tokens: int
    completion_tokens: int
    latency_s: float
    cached_tokens: int = 0

    def __post_init__(self):
        if self.finish_reason not in FINISH_REASONS:
            raise ValueError(
                f"finish_reason must be one of {FINISH_REASONS}, got {self.finish_reason!r}"
            )
        if len(self.logprobs) != len(self.output_ids):
            raise ValueError(f"{len(self.output_ids)} output ids but {len(self.logprobs)} logprobs")


@runtime_checkable
class RolloutEngine(Protocol):
    """Anything that turns prompts into completions.

    `generate` returns completions in request order.  `update_weights` takes a
    model (an `nnx.Module`) or its `nnx.State` and the learner's version
    number; engines that cannot apply weights raise.  `close` releases what the
    engine holds (worker threads, HTTP sessions); it is synchronous, safe to
    call twice, and the engine serves no request after it.
    """

    async def generate(self, requests: Sequence[GenerateRequest]) -> list[Completion]: ...

    async def update_weights(self, model_state: Any, *, version: int) -> None: ...

    async def health(self) -> bool: ...

    def close(self) -> None: ...


# `rollout.engine` names. Engines are imported on first use, so that, e.g., the
# scripted engine needs no JAX; "package.module:Class" names one's own.
ENGINES: Registry[type] = Registry("rollout engine")
ENGINES.register_lazy("jax", "orchestra_jax.rollout.jax_engine:JaxEngine")
ENGINES.register_lazy("sglang", "orchestra_jax.rollout.sglang_client:SGLangClient")
ENGINES.register_lazy("scripted", "orchestra_jax.rollout.scripted:ScriptedEngine")


def make_engine(name: str, **kwargs) -> RolloutEngine:
    """Build the engine registered under `name` ("jax", "sglang", "scripted")."""
    return ENGINES.get(name)(**kwargs)
