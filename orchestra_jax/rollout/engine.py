"""The rollout protocol: what the agent loop and the learner ask of any sampler.

Every engine (the in-process JAX sampler, the SGLang and vLLM clients, the
scripted test engine) is token-in/token-out: it receives prompt token ids and returns the
sampled token ids with the log-probability of each one, so training always sees
the tokens that were actually generated, never a re-tokenised text.

Log-probability convention (shared by all engines):

    logprobs[i] = log_softmax(logits_i / T)[output_ids[i]]

i.e. under the temperature-scaled distribution *before* top-p/top-k/min-p
truncation (the distribution the learner recomputes).  Greedy decoding (T = 0)
reports the log-probability under T = 1.  With repetition, frequency or
presence penalties, `logits_i` are the penalised logits (as SGLang reports
them), which the learner does not recompute.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import AsyncIterator, Sequence
from typing import Any, Literal, Protocol, runtime_checkable

from orchestra_jax.registry import Registry
from orchestra_jax.rollout.token_constraint import TokenConstraint

FinishReason = Literal["stop", "length", "abort", "context"]
FINISH_REASONS = ("stop", "length", "abort", "context")


SEED_SPACE = 2**64  # seeds are 64-bit words


def _finite(name: str, value: float) -> None:
    if not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value}")


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """How to sample one completion.

    temperature: 0 means greedy (argmax); otherwise logits are divided by it.
    top_p: keep the smallest set of most likely tokens whose mass reaches top_p.
    top_k: keep the k most likely tokens; -1 (or 0) keeps all.
    min_p: keep tokens whose probability is at least min_p times the largest; 0 is off.
    repetition_penalty, frequency_penalty, presence_penalty: penalise tokens this
      completion already generated (SGLang's definitions, see
      `sampling.apply_penalties`); 1, 0 and 0 are off.
    max_new_tokens: hard cap on generated tokens (finish reason "length"); 0 asks
      for none (the prompt alone, e.g. to score it).
    stop_token_ids: generation ends after emitting any of these (finish reason
      "stop"); the stop token is part of the output.
    stop: generation ends once the decoded output contains any of these strings
      (finish reason "stop"); the output keeps the token that completed it. Needs
      an engine that can decode text.
    seed: makes the sample reproducible; the same request and seed give the
      same tokens whatever else shares the batch.  None draws a fresh seed.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    max_new_tokens: int = 256
    stop_token_ids: tuple[int, ...] = ()
    stop: tuple[str, ...] = ()
    seed: int | None = None

    def __post_init__(self):
        # Accept any sequence for stop ids / strings but store hashable tuples.
        object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in self.stop_token_ids))
        stop = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)
        object.__setattr__(self, "stop", stop)
        for name in ("temperature", "top_p", "min_p", "repetition_penalty"):
            _finite(name, getattr(self, name))
        _finite("frequency_penalty", self.frequency_penalty)
        _finite("presence_penalty", self.presence_penalty)
        if not self.temperature >= 0.0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < -1:
            raise ValueError(f"top_k must be -1 (off) or >= 0, got {self.top_k}")
        if not 0.0 <= self.min_p <= 1.0:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}")
        if not self.repetition_penalty > 0.0:
            raise ValueError(f"repetition_penalty must be > 0, got {self.repetition_penalty}")
        if self.max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be >= 0, got {self.max_new_tokens}")
        if any(t < 0 for t in self.stop_token_ids):
            raise ValueError(f"stop_token_ids must be non-negative, got {self.stop_token_ids}")
        if not all(isinstance(s, str) and s for s in self.stop):
            raise ValueError(f"stop must hold non-empty strings, got {self.stop!r}")
        if self.seed is not None and not 0 <= self.seed < SEED_SPACE:
            raise ValueError(f"seed must be in [0, 2**64), got {self.seed}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def penalized(self) -> bool:
        """Whether any repetition, frequency or presence penalty is on."""
        return (
            self.repetition_penalty != 1.0
            or self.frequency_penalty != 0.0
            or self.presence_penalty != 0.0
        )


@dataclasses.dataclass(frozen=True)
class GenerateRequest:
    """One prompt (token ids) and how to continue it.

    top_logprobs_num: also return, at every generated position, the this-many most
      likely tokens and their logprobs (`Completion.top_logprobs`).
    logprob_start_len: -1, or also score the prompt from this position on
      (`Completion.prompt_logprobs`; position 0 has no logprob).
    affinity_key: requests sharing it (the turns of one episode) go to the same
      server where there are several, the one holding their common prefix in its
      cache (`rollout/http/server_pool.py`); None: any server.
    constraint: None, or the tokens the engine may sample, as an automaton over
      token ids (`rollout/token_constraint.py`); only the JAX engine follows
      one, the HTTP clients refuse such requests.
    """

    input_ids: list[int]
    sampling: SamplingParams = dataclasses.field(default_factory=SamplingParams)
    request_id: str | None = None
    top_logprobs_num: int = 0
    logprob_start_len: int = -1
    affinity_key: str | None = None
    constraint: TokenConstraint | None = None

    def __post_init__(self):
        if len(self.input_ids) == 0:
            raise ValueError("input_ids must contain at least one token")
        if any((not isinstance(t, int)) or t < 0 for t in self.input_ids):
            raise ValueError("input_ids must be non-negative ints")
        if self.top_logprobs_num < 0:
            raise ValueError(f"top_logprobs_num must be >= 0, got {self.top_logprobs_num}")
        if not -1 <= self.logprob_start_len <= len(self.input_ids):
            raise ValueError(
                f"logprob_start_len must be -1 or in [0, {len(self.input_ids)}] (the prompt), "
                f"got {self.logprob_start_len}"
            )


TopLogprobs = list[tuple[int, float]]  # (token id, logprob), most likely first


@dataclasses.dataclass
class Completion:
    """What an engine generated for one request.

    output_ids: the new tokens only (not the prompt), stop token included.
    logprobs: one float per output token, see the module docstring.
    finish_reason: "stop" (a stop token or string), "length" (max_new_tokens or
      the context ran out) or "abort" (the engine gave up on the request, e.g. a
      weight update that aborts requests in flight; the tokens so far are kept)
      or "context" (a server refused it: prompt plus max_new_tokens exceed the
      context it serves; no tokens; the HTTP clients, `rollout/http/client.py`);
      None only in the partial completions a streaming engine yields before its
      last one.
    cached_tokens: prompt tokens whose keys/values were reused from an earlier
      request instead of recomputed (SGLang's `meta_info.cached_tokens`); 0 when
      the engine does not say.
    weight_version: the version of the weights that generated these tokens (all of
      them, unless `first_weight_version` is set); None when unknown.
    matched_stop: the stop token id or stop string that ended it ("stop" only).
    top_logprobs: per output token, the request's `top_logprobs_num` most likely
      tokens; None unless asked for.
    prompt_logprobs / prompt_top_logprobs: per prompt token from the request's
      `logprob_start_len` on, its logprob (None at position 0) and top tokens;
      None unless asked for.
    first_weight_version: set only when a weight update landed while this
      completion was being generated (a partial rollout: `JaxEngine.update_weights(
      ..., partial=True)`): the version of its first tokens, `weight_version` that of
      its last; the keys/values written before the update stay those of the older
      weights, as in AReaL's and verl's partial rollouts.
    """

    output_ids: list[int]
    logprobs: list[float]
    finish_reason: FinishReason | None
    prompt_tokens: int
    completion_tokens: int
    latency_s: float
    cached_tokens: int = 0
    weight_version: int | None = None
    matched_stop: int | str | None = None
    top_logprobs: list[TopLogprobs] | None = None
    prompt_logprobs: list[float | None] | None = None
    prompt_top_logprobs: list[TopLogprobs | None] | None = None
    first_weight_version: int | None = None

    def __post_init__(self):
        if self.finish_reason is not None and self.finish_reason not in FINISH_REASONS:
            raise ValueError(
                f"finish_reason must be one of {FINISH_REASONS}, got {self.finish_reason!r}"
            )
        if len(self.logprobs) != len(self.output_ids):
            raise ValueError(f"{len(self.output_ids)} output ids but {len(self.logprobs)} logprobs")


@runtime_checkable
class RolloutEngine(Protocol):
    """Anything that turns prompts into completions.

    `generate` returns completions in request order; cancelling it cancels the
    requests' work. `update_weights` takes a model (an `nnx.Module`) or its
    `nnx.State` and the learner's version number; it waits for the requests in
    flight to finish on the old weights (or, with `abort_in_flight`, ends them
    with finish reason "abort"), so no completion mixes versions, and drops any
    cached prefixes. Engines that cannot apply weights raise. `flush_cache`
    drops cached prefixes and says whether it did (an engine with requests
    running may refuse, as SGLang does).
    `close` releases what the engine holds (worker threads, HTTP sessions); it
    is synchronous, safe to call twice, and the engine serves no request after it.
    """

    async def generate(self, requests: Sequence[GenerateRequest]) -> list[Completion]: ...

    async def update_weights(
        self, model_state: Any, *, version: int, abort_in_flight: bool = False
    ) -> None: ...

    async def flush_cache(self) -> bool: ...

    async def health(self) -> bool: ...

    def close(self) -> None: ...


@runtime_checkable
class ServedEngine(Protocol):
    """An engine whose weights live on inference servers (the SGLang and vLLM clients,
    `rollout/http/client.py`): its `update_weights` loads them on every server and
    verifies each (version and sync probe), and it can say which version each server
    holds now."""

    async def weight_versions(self) -> dict[str, str | None]:
        """Server URL -> the weight version it reports (None: it did not answer)."""
        ...


@runtime_checkable
class StreamingEngine(Protocol):
    """An engine that can also report a request's tokens as they are generated."""

    def stream(self, request: GenerateRequest) -> AsyncIterator[Completion]:
        """Partial completions (finish_reason None) as tokens arrive, then the final one."""
        ...


# `rollout.engine` names. Engines are imported on first use, so that, e.g., the
# scripted engine needs no JAX; "package.module:Class" names one's own.
ENGINES: Registry[type] = Registry("rollout engine")
ENGINES.register_lazy("jax", "orchestra_jax.rollout.jax.engine:make_jax_engine")
ENGINES.register_lazy("sglang", "orchestra_jax.rollout.http.sglang_client:SGLangClient")
ENGINES.register_lazy("vllm", "orchestra_jax.rollout.http.vllm_client:VLLMClient")
ENGINES.register_lazy("scripted", "orchestra_jax.rollout.scripted:ScriptedEngine")


def make_engine(name: str, **kwargs) -> RolloutEngine:
    """Build the engine registered under `name` ("jax", "sglang", "vllm", "scripted")."""
    return ENGINES.get(name)(**kwargs)
