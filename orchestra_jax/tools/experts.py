"""Expert models behind one interface, and a client for OpenAI-compatible servers.

An expert is any chat model the meta-tools call (a frontier API, a local vLLM
or SGLang server, or a `SimulatedExpert`). Cost is not the expert's business:
the calling tool multiplies the reported token usage by the alias's price from
the task's `ToolConfig`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import time
from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

import aiohttp

RETRYABLE_STATUS = frozenset({408, 409, 425, 429, 500, 502, 503, 504})


@dataclasses.dataclass(frozen=True)
class ExpertReply:
    """What an expert returned: text, token usage and latency in seconds."""

    text: str
    prompt_tokens: int
    completion_tokens: int
    latency_s: float


class ExpertError(RuntimeError):
    """An expert call failed for good (after retries, or a non-retryable error)."""


@runtime_checkable
class ExpertClient(Protocol):
    """A chat model.

    `ctx` (a `ToolContext`, optional) is the episode the call belongs to. Real
    models ignore it; simulated experts read the task from it.
    """

    async def complete(
        self,
        messages: Sequence[dict[str, Any]],
        *,
        max_tokens: int,
        temperature: float,
        ctx: Any = None,
    ) -> ExpertReply: ...


def backoff_delay(attempt: int, base_s: float, max_s: float) -> float:
    """Exponential backoff: min(base_s * 2**attempt, max_s), attempt from 0."""
    return min(base_s * (2.0**attempt), max_s)


class OpenAIChatExpert:
    """An expert served by any OpenAI-compatible `/v1/chat/completions` endpoint.

    Args:
      base_url: server root, e.g. "https://api.openai.com/v1" or
        "http://127.0.0.1:30000/v1" (`/chat/completions` is appended).
      model: the `model` field of the request.
      api_key_env: environment variable holding the key; None sends no key. A
        named variable that is unset is an error at construction.
      max_concurrency: requests in flight at once from this client.
      retries: extra attempts after a 5xx/408/429, a connection error or a
        timeout (4xx errors fail at once).
      timeout: seconds per attempt.
      backoff_s / max_backoff_s: see `backoff_delay`.
      extra_body: fields merged into every request (e.g. reasoning settings).
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api_key_env: str | None = "OPENAI_API_KEY",
        max_concurrency: int = 16,
        retries: int = 3,
        timeout: float = 600.0,
        backoff_s: float = 1.0,
        max_backoff_s: float = 30.0,
        extra_body: dict[str, Any] | None = None,
    ):
        if max_concurrency < 1 or retries < 0 or timeout <= 0:
            raise ValueError("max_concurrency >= 1, retries >= 0, timeout > 0")
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.model = model
        self.api_key = None
        if api_key_env is not None:
            self.api_key = os.environ.get(api_key_env)
            if not self.api_key:
                raise ExpertError(
                    f"expert {model!r}: environment variable "
                    f"{api_key_env} is not set (pass api_key_env=None "
                    "for servers without authentication)"
                )
        self.retries = retries
        self.timeout = timeout
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.extra_body = dict(extra_body or {})
        self._semaphore = asyncio.Semaphore(max_concurrency)

    def _headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        return headers

    async def complete(
        self,
        messages: Sequence[dict[str, Any]],
        *,
        max_tokens: int = 1024,
        temperature: float = 0.0,
        ctx: Any = None,
    ) -> ExpertReply:
        """POSTs the chat request; measures latency over the successful attempt."""
        del ctx  # a real model sees only the messages
        body = {
            "model": self.model,
            "messages": list(messages),
            "max_tokens": max_tokens,
            "temperature": temperature,
            **self.extra_body,
        }
        last_error = "no attempt made"
        async with self._semaphore:
            for attempt in range(self.retries + 1):
                if attempt:
                    await asyncio.sleep(
                        backoff_delay(attempt - 1, self.backoff_s, self.max_backoff_s)
                    )
                start = time.monotonic()
                try:
                    timeout = aiohttp.ClientTimeout(total=self.timeout)
                    async with aiohttp.ClientSession(timeout=timeout) as session:
                        async with session.post(
                            self.url, json=body, headers=self._headers()
                        ) as resp:
                            text = await resp.text()
                            if resp.status == 200:
                                return self._parse(text, time.monotonic() - start)
                            last_error = f"HTTP {resp.status}: {text[:300]}"
                            if resp.status not in RETRYABLE_STATUS:
                                break
                except (aiohttp.ClientError, asyncio.TimeoutError) as e:
                    last_error = f"{type(e).__name__}: {e}"
        raise ExpertError(
            f"expert {self.model!r} at {self.url} failed after "
            f"{attempt + 1} attempt(s); last error: {last_error}"
        )

    def _parse(self, text: str, latency_s: float) -> ExpertReply:
        try:
            data = json.loads(text)
            content = data["choices"][0]["message"].get("content") or ""
            usage = data.get("usage") or {}
            return ExpertReply(
                text=content,
                prompt_tokens=int(usage.get("prompt_tokens", 0)),
                completion_tokens=int(usage.get("completion_tokens", 0)),
                latency_s=latency_s,
            )
        except (ValueError, KeyError, IndexError, TypeError) as e:
            raise ExpertError(
                f"expert {self.model!r}: malformed response ({type(e).__name__}: {e}): {text[:300]}"
            ) from e
