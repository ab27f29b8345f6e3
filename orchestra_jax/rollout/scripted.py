"""A deterministic engine for tests: completions come from a script, not a model.

Use it to test code that drives a `RolloutEngine` (agent loop, routers, the
rollout server) without a model:

    # a callable decides the tokens from the prompt and the request
    engine = ScriptedEngine(lambda ids, req: [7, 8, IM_END])
    # or a list of outputs handed out in order, one per request
    engine = ScriptedEngine([[7, 8, IM_END], [9, IM_END]])

The engine then applies the request's sampling rules the way a real engine
would: the output is cut after the first stop token (finish reason "stop") or at
`max_new_tokens` (finish reason "length").  An output that ends without a stop
token and under the cap finishes with "stop", as if the model had emitted an
end-of-sequence token that is not part of the output.

Log-probabilities are `logprob` (default 0.0) for every token, unless the policy
returns a `(token_ids, logprobs)` pair.  Every request it receives is kept in
`requests`, and every weight update's version in `weight_versions`; each
completion carries the version current when it was made. Stop strings are
refused (a script has no text to match).
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Callable, Sequence
from typing import Any, cast

from orchestra_jax.rollout.engine import Completion, FinishReason, GenerateRequest

PolicyOutput = Sequence[int] | tuple[Sequence[int], Sequence[float]]
Policy = Callable[[list[int], GenerateRequest], PolicyOutput]


class ScriptedEngine:
    """A `RolloutEngine` whose outputs come from `policy` (a callable or a list)."""

    def __init__(
        self,
        policy: Policy | Sequence[PolicyOutput],
        *,
        logprob: float = 0.0,
        latency_s: float = 0.0,
        healthy: bool = True,
    ):
        if callable(policy):
            self._policy = policy
            self._script = None
        else:
            self._policy = None
            self._script = collections.deque(policy)
        self.logprob = float(logprob)
        self.latency_s = float(latency_s)  # simulated per-call delay (asyncio.sleep)
        self.healthy = healthy
        self.requests: list[GenerateRequest] = []
        self.weight_versions: list[int] = []
        self.weight_version = 0
        self.model_state: Any = None

    def _next_output(self, request: GenerateRequest) -> PolicyOutput:
        if self._policy is not None:
            return self._policy(list(request.input_ids), request)
        if not self._script:
            raise RuntimeError(
                f"ScriptedEngine ran out of scripted outputs at request #{len(self.requests)}"
            )
        return self._script.popleft()

    def _complete(self, request: GenerateRequest) -> Completion:
        if request.sampling.stop:
            raise ValueError("stop strings are not supported by ScriptedEngine")
        start = time.perf_counter()
        output = self._next_output(request)
        if isinstance(output, tuple) and len(output) == 2 and not isinstance(output[0], int):
            token_ids, token_logprobs = cast(tuple[Sequence[int], Sequence[float]], output)
            ids = [int(t) for t in token_ids]
            logprobs = [float(x) for x in token_logprobs]
            if len(ids) != len(logprobs):
                raise ValueError(f"policy returned {len(ids)} ids but {len(logprobs)} logprobs")
        else:
            ids = [int(t) for t in cast(Sequence[int], output)]
            logprobs = [self.logprob] * len(ids)
        stops = set(request.sampling.stop_token_ids)
        ids, finish = apply_stop_rules(
            ids, request.sampling.stop_token_ids, request.sampling.max_new_tokens
        )
        return Completion(
            output_ids=ids,
            logprobs=logprobs[: len(ids)],
            finish_reason=finish,
            prompt_tokens=len(request.input_ids),
            completion_tokens=len(ids),
            latency_s=time.perf_counter() - start + self.latency_s,
            weight_version=self.weight_version,
            matched_stop=ids[-1] if finish == "stop" and ids and ids[-1] in stops else None,
        )

    async def generate(self, requests: Sequence[GenerateRequest]) -> list[Completion]:
        self.requests.extend(requests)
        completions = [self._complete(r) for r in requests]
        if self.latency_s:
            await asyncio.sleep(self.latency_s)
        return completions

    async def update_weights(
        self,
        model_state: Any,
        *,
        version: int,
        abort_in_flight: bool = False,
        partial: bool = False,
    ) -> None:
        """Completions are made whole before any wait, so none is in flight to abort or
        to continue on the new weights (`partial`, as `JaxEngine` takes it)."""
        del abort_in_flight, partial
        self.model_state = model_state
        self.weight_versions.append(int(version))
        self.weight_version = int(version)

    async def flush_cache(self) -> bool:
        return True

    async def health(self) -> bool:
        return self.healthy

    def close(self) -> None:
        """Nothing to release: a script holds no threads or connections."""


def apply_stop_rules(
    ids: list[int], stop_token_ids: Sequence[int], max_new_tokens: int
) -> tuple[list[int], FinishReason]:
    """Cut `ids` after the first stop token or at `max_new_tokens`.

    Returns the kept ids and the finish reason ("stop" or "length").
    """
    stops = set(stop_token_ids)
    for i, token in enumerate(ids[:max_new_tokens]):
        if token in stops:
            return ids[: i + 1], "stop"
    if len(ids) >= max_new_tokens:
        return ids[:max_new_tokens], "length"
    return ids, "stop"
