"""Gather one-request-at-a-time calls from many episodes into engine batches.

Each episode awaits `batcher.generate(request)` for its next turn. A batched
engine (the in-process JAX sampler) is far faster on one batch of 64 than on 64
batches of one, so the batcher holds requests back until one of:

- every live episode is waiting on generation (nobody else can join: send now),
- `max_batch_size` requests are waiting,
- the oldest waiting request has waited `max_wait_s` (the others are still
  running tools; do not let the ready ones idle behind them),

and it keeps at most `max_in_flight` engine calls running at once; requests that
arrive meanwhile form the next batch. Engines that batch continuously inside
(`JaxEngine`, SGLang) admit a late request into a free slot mid-decode, so they
profit from many calls in flight (the default); an engine that serves one call
at a time gains nothing from more than 1.
"""

from __future__ import annotations

import asyncio
from typing import Any


class GenerationBatcher:
    """Micro-batching front of a `RolloutEngine` shared by concurrent episodes."""

    def __init__(
        self,
        engine: Any,
        *,
        max_batch_size: int = 256,
        max_wait_s: float = 0.005,
        max_in_flight: int = 64,
    ):
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
        if max_wait_s < 0:
            raise ValueError(f"max_wait_s must be >= 0, got {max_wait_s}")
        if max_in_flight < 1:
            raise ValueError(f"max_in_flight must be >= 1, got {max_in_flight}")
        self._engine = engine
        self._max_batch_size = max_batch_size
        self._max_wait_s = max_wait_s
        self._max_in_flight = max_in_flight
        self._pending: list[tuple[Any, asyncio.Future]] = []
        self._num_live = 0  # episodes that may still send a request
        self._in_flight_calls = 0
        self._in_flight_requests = 0
        self._timer: asyncio.TimerHandle | None = None
        self._tasks: set[asyncio.Task] = set()
        self.batch_sizes: list[int] = []  # one entry per engine call, for metrics

    @property
    def engine(self) -> Any:
        """The engine the batches go to."""
        return self._engine

    def episode_started(self) -> None:
        self._num_live += 1

    def episode_finished(self) -> None:
        self._num_live -= 1
        self._maybe_flush()  # the finished episode may have been the one we waited for

    async def generate(self, request: Any) -> Any:
        """One completion for `request`, computed in a batch with others."""
        future = asyncio.get_running_loop().create_future()
        self._pending.append((request, future))
        self._maybe_flush()
        return await future

    def _maybe_flush(self) -> None:
        if not self._pending or self._in_flight_calls >= self._max_in_flight:
            return  # a finishing call re-checks
        busy_elsewhere = self._num_live - len(self._pending) - self._in_flight_requests
        if len(self._pending) >= self._max_batch_size or busy_elsewhere <= 0:
            self._flush()
        elif self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self._max_wait_s, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        if self._pending and self._in_flight_calls < self._max_in_flight:
            self._flush()

    def _flush(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        batch = self._pending[: self._max_batch_size]
        self._pending = self._pending[self._max_batch_size :]
        self._in_flight_calls += 1
        self._in_flight_requests += len(batch)
        task = asyncio.create_task(self._run(batch))
        self._tasks.add(task)  # keep a reference so the task is not collected mid-flight
        task.add_done_callback(self._tasks.discard)
        if self._pending:
            self._maybe_flush()

    async def _run(self, batch: list[tuple[Any, asyncio.Future]]) -> None:
        self.batch_sizes.append(len(batch))
        try:
            completions = await self._engine.generate([request for request, _ in batch])
            if len(completions) != len(batch):
                raise RuntimeError(
                    f"engine returned {len(completions)} completions for {len(batch)} requests"
                )
        except Exception as e:  # every waiting episode learns of the failure
            for _, future in batch:
                if not future.done():
                    future.set_exception(e)
        else:
            for (_, future), completion in zip(batch, completions):
                if not future.done():
                    future.set_result(completion)
        finally:
            self._in_flight_calls -= 1
            self._in_flight_requests -= len(batch)
            self._maybe_flush()
