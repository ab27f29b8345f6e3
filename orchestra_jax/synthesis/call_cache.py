"""Every generator call paid for once: results persisted, keyed by their inputs, and accounted.

`CachedGenerator` wraps a `Generator`. A call's key is the SHA-256 of its
inputs (the generator's `model`, the call's stage, key, messages and sampling
settings); its reply is written to `<dir>/<key>.json` (written to a temporary
file, then renamed: a killed run leaves whole files only) before the stage
sees it. A run that is started again over the same folder reads the replies
it has and calls the generator only for the rest, so a killed run continues
where it stopped and pays for nothing twice. At most `max_concurrency` calls
are in flight; a call that fails for good (the endpoint's retries spent)
raises `GeneratorFailure` naming the call, and nothing is stored for it.

`Ledger` counts, per stage: calls paid in this run, calls answered from the
folder, tokens and USD of both (the run's own cost and what the data cost in
all).
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import os
import pathlib
import tempfile
import weakref
from typing import Any

from orchestra_jax.synthesis.generator import Call, Generator, Reply


class GeneratorFailure(RuntimeError):
    """A generator call that failed for good (the message names the stage and key)."""


@dataclasses.dataclass
class StageUsage:
    """One stage's calls: paid now, or reused from earlier runs; tokens and USD."""

    paid_calls: int = 0
    reused_calls: int = 0
    failed_calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0  # this run's spending
    reused_cost_usd: float = 0.0  # what the reused replies cost when they were made


class Ledger:
    """Per-stage `StageUsage` (module docstring)."""

    def __init__(self):
        self.stages: dict[str, StageUsage] = {}

    def stage(self, name: str) -> StageUsage:
        return self.stages.setdefault(name, StageUsage())

    def record(self, stage: str, reply: Reply, *, reused: bool) -> None:
        usage = self.stage(stage)
        usage.prompt_tokens += reply.prompt_tokens
        usage.completion_tokens += reply.completion_tokens
        if reused:
            usage.reused_calls += 1
            usage.reused_cost_usd += reply.cost_usd
        else:
            usage.paid_calls += 1
            usage.cost_usd += reply.cost_usd

    def totals(self) -> StageUsage:
        total = StageUsage()
        for usage in self.stages.values():
            for field in dataclasses.fields(StageUsage):
                setattr(total, field.name, getattr(total, field.name) + getattr(usage, field.name))
        return total

    def to_dict(self) -> dict[str, Any]:
        return {name: dataclasses.asdict(u) for name, u in self.stages.items()}


def call_key(model: str, call: Call) -> str:
    """SHA-256 of everything that determines a call's reply."""
    payload = {
        "model": model,
        "stage": call.stage,
        "key": call.key,
        "messages": list(call.messages),
        "max_tokens": call.max_tokens,
        "temperature": call.temperature,
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode("utf-8")).hexdigest()


class CachedGenerator:
    """A generator whose replies persist in `directory` (module docstring)."""

    def __init__(
        self, generator: Generator, directory: str | os.PathLike, *, max_concurrency: int = 8
    ):
        if max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1, got {max_concurrency}")
        self.generator = generator
        self.model = generator.model
        self.directory = pathlib.Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.max_concurrency = max_concurrency
        self.ledger = Ledger()
        self._semaphores: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def _semaphore(self) -> asyncio.Semaphore:
        loop = asyncio.get_running_loop()
        if loop not in self._semaphores:
            self._semaphores[loop] = asyncio.Semaphore(self.max_concurrency)
        return self._semaphores[loop]

    def path(self, call: Call) -> pathlib.Path:
        return self.directory / f"{call_key(self.model, call)}.json"

    async def generate(self, call: Call) -> Reply:
        path = self.path(call)
        stored = _read(path)
        if stored is not None:
            self.ledger.record(call.stage, stored, reused=True)
            return stored
        async with self._semaphore():
            try:
                reply = await self.generator.generate(call)
            except Exception as e:
                self.ledger.stage(call.stage).failed_calls += 1
                raise GeneratorFailure(
                    f"generator call {call.stage}:{call.key} failed: {type(e).__name__}: {e}"
                ) from e
        _write(path, call, reply)
        self.ledger.record(call.stage, reply, reused=False)
        return reply


def _read(path: pathlib.Path) -> Reply | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    return Reply(**data["reply"])


def _write(path: pathlib.Path, call: Call, reply: Reply) -> None:
    record = {
        "stage": call.stage,
        "key": call.key,
        "messages": list(call.messages),
        "reply": dataclasses.asdict(reply),
    }
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".json")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(record, f, ensure_ascii=False)
    os.replace(tmp, path)
