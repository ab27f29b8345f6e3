"""The generating model of the synthesis pipeline: one chat call in, one reply out.

A `Call` is what a stage asks: its stage, a key naming the item within the
stage (e.g. "tasks/purpose-3/sample-0"), the chat messages and the sampling
settings. A `Generator` answers it with a `Reply` (text, token counts, cost
in USD). Kinds, by config name (`GENERATORS`, `synthesis.generator.kind`):

- "catalogue": a model of a catalogue file (`tools/experts/catalogue.py`) on any
  OpenAI-compatible endpoint, through the experts' client
  (`tools/experts/client.OpenAIChatExpert`: retries with backoff on 5xx/429/timeouts,
  at most `max_concurrency` requests in flight), priced at the entry's
  `price_in` / `price_out` per million tokens.
- "scripted": recorded replies, one per call key, from a JSON file
  (`{"replies": {key: text}}`); tokens are counted as whitespace-separated
  words of the prompt and of the reply, priced as a catalogue entry would be.
  Tests, the demo fixture and the benchmark use it.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

from orchestra_jax.registry import Registry
from orchestra_jax.tools.pricing import token_cost


@dataclasses.dataclass(frozen=True)
class Call:
    """One request of a stage; `key` names the item, so two items never share a reply."""

    stage: str
    key: str
    messages: tuple[dict[str, str], ...]
    max_tokens: int = 8192
    temperature: float = 1.0


@dataclasses.dataclass(frozen=True)
class Reply:
    """A generator's answer: its text, tokens in and out, and what it cost (USD)."""

    text: str
    prompt_tokens: int
    completion_tokens: int
    cost_usd: float


@runtime_checkable
class Generator(Protocol):
    """Answers calls; `model` names what answers (it enters every call's cache key)."""

    model: str

    async def generate(self, call: Call) -> Reply: ...


class CatalogueGenerator:
    """A catalogue model on its OpenAI-compatible endpoint (module docstring)."""

    def __init__(
        self,
        catalogue: str | os.PathLike,
        name: str,
        *,
        max_concurrency: int = 8,
        retries: int = 3,
        timeout_s: float = 600.0,
        backoff_s: float = 1.0,
    ):
        from orchestra_jax.tools.experts.catalogue import load_catalogue
        from orchestra_jax.tools.experts.client import OpenAIChatExpert

        entries = {m.name: m for m in load_catalogue(catalogue).models}
        if name not in entries:
            raise ValueError(
                f"synthesis generator {name!r} is not in {catalogue}: {sorted(entries)}"
            )
        entry = entries[name]
        self.model = f"{entry.model}@{entry.base_url}"
        self.price_in, self.price_out = entry.price_in, entry.price_out
        self.client = OpenAIChatExpert(
            entry.base_url,
            entry.model,
            api_key_env=entry.api_key_env,
            max_concurrency=max_concurrency,
            retries=retries,
            timeout=timeout_s,
            backoff_s=backoff_s,
            extra_body=dict(entry.extra_body),
            name=entry.name,
            reasoning_model=entry.reasoning_model,
        )

    async def generate(self, call: Call) -> Reply:
        reply = await self.client.complete(
            list(call.messages), max_tokens=call.max_tokens, temperature=call.temperature
        )
        return Reply(
            text=reply.text,
            prompt_tokens=reply.prompt_tokens,
            completion_tokens=reply.completion_tokens,
            cost_usd=token_cost(
                reply.prompt_tokens, reply.completion_tokens, self.price_in, self.price_out
            ),
        )


class ScriptedGenerator:
    """Recorded replies keyed by call key (module docstring); a key it lacks is an error."""

    def __init__(
        self,
        replies: dict[str, str] | str | os.PathLike,
        *,
        price_in: float = 0.0,
        price_out: float = 0.0,
        model: str = "scripted",
    ):
        if not isinstance(replies, dict):
            with open(replies, encoding="utf-8") as f:
                replies = json.load(f)["replies"]
        self.replies: dict[str, str] = dict(replies)  # type: ignore[arg-type]
        self.model = model
        self.price_in, self.price_out = price_in, price_out
        self.calls: list[str] = []  # the keys asked, in order

    async def generate(self, call: Call) -> Reply:
        self.calls.append(call.key)
        if call.key not in self.replies:
            raise KeyError(f"the scripted generator has no reply for call {call.key!r}")
        text = self.replies[call.key]
        prompt = sum(len(m["content"].split()) for m in call.messages)
        completion = len(text.split())
        return Reply(
            text, prompt, completion, token_cost(prompt, completion, self.price_in, self.price_out)
        )


def _catalogue(config: Any) -> Generator:
    return CatalogueGenerator(
        config.catalogue,
        config.model,
        max_concurrency=config.max_concurrency,
        retries=config.retries,
        timeout_s=config.timeout_s,
    )


def _scripted(config: Any) -> Generator:
    return ScriptedGenerator(config.script, price_in=config.price_in, price_out=config.price_out)


# `synthesis.generator.kind` -> `(generator config section) -> Generator`.
GENERATORS: Registry[Any] = Registry("synthesis generator")
GENERATORS.register("catalogue", _catalogue)
GENERATORS.register("scripted", _scripted)


def make_generator(config: Any) -> Generator:
    """The generator of a config's `generator` section (`GENERATORS[kind]`)."""
    return GENERATORS.get(config.kind)(config)


def messages(system: str, user: str) -> tuple[dict[str, str], ...]:
    """A system and a user message."""
    return ({"role": "system", "content": system}, {"role": "user", "content": user})


__all__: Sequence[str] = (
    "Call",
    "Reply",
    "Generator",
    "CatalogueGenerator",
    "ScriptedGenerator",
    "GENERATORS",
    "make_generator",
    "messages",
)
