"""Expert models behind one interface, and the client for OpenAI-compatible servers.

An expert is any chat model the meta-tools call (a frontier API, a local vLLM
or SGLang server, the project's own `rollout.server`, or a `SimulatedExpert`).
Cost is not the expert's business: the calling tool multiplies the reported
token usage by the alias's price from the task's `ToolConfig`.

`OpenAIChatExpert` is the one HTTP client of the project's live endpoints:
the meta-tools' experts, the LLM judge (`rewards/judge.py`) and any other
party that talks to a chat model (a simulated user) use it:

    client = OpenAIChatExpert("http://127.0.0.1:30000/v1", "my-model", api_key_env=None)
    reply = await client.complete(messages, max_tokens=256, temperature=0.0)
    reply.text, reply.prompt_tokens, reply.completion_tokens, reply.latency_s

It retries 408/409/425/429/5xx, connection errors and timeouts with
exponential backoff, then raises `ExpertError` naming the model and URL; other
4xx fail at once. `latency_s` is the wall time of the successful attempt.
`probe_endpoint` checks at start-up that a server answers at all.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import time
import urllib.error
import urllib.request
import weakref
from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

import aiohttp

from orchestra_jax.infra_failure import ServiceError

RETRYABLE_STATUS = frozenset({408, 409, 425, 429, 500, 502, 503, 504})


@dataclasses.dataclass(frozen=True)
class ExpertReply:
    """What an expert returned: text, token usage and latency in seconds.

    `tool_calls` are the reply's OpenAI `tool_calls` (when the request offered
    `tools`); `attempts` counts the HTTP attempts it took (1: no retry).
    """

    text: str
    prompt_tokens: int
    completion_tokens: int
    latency_s: float
    tool_calls: tuple[dict[str, Any], ...] = ()
    attempts: int = 1


class ExpertError(ServiceError):
    """An expert call failed for good (after retries, or a non-retryable error).

    `endpoint`: the URL that failed ("" where there is none, as for a missing key).
    """

    def __init__(self, message: str, *, endpoint: str = ""):
        super().__init__(message)
        self.endpoint = endpoint


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


@dataclasses.dataclass
class ClientStats:
    """What one client did: requests answered, failed for good, retries, tokens."""

    calls: int = 0
    failures: int = 0
    retries: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0


class OpenAIChatExpert:
    """An expert served by any OpenAI-compatible `/v1/chat/completions` endpoint.

    Args:
      base_url: server root, e.g. "https://api.openai.com/v1" or
        "http://127.0.0.1:30000/v1" (`/chat/completions` is appended).
      model: the `model` field of the request.
      api_key_env: environment variable holding the key; None sends no key. A
        named variable that is unset is an error at construction.
      max_concurrency: requests in flight at once from this client (per event loop).
      retries: extra attempts after a 5xx/408/429, a connection error or a
        timeout (other 4xx errors fail at once).
      timeout: seconds per attempt.
      backoff_s / max_backoff_s: see `backoff_delay`.
      extra_body: fields merged into every request (e.g. reasoning settings).
      name: how errors and stats name it (default: `model`).
      reasoning_model: an OpenAI reasoning model (gpt-5, the o-series), whose API
        takes `max_completion_tokens` instead of `max_tokens` and only its default
        temperature: requests say so, and leave the temperature out.
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
        name: str | None = None,
        reasoning_model: bool = False,
    ):
        if max_concurrency < 1 or retries < 0 or timeout <= 0:
            raise ValueError("max_concurrency >= 1, retries >= 0, timeout > 0")
        self.base_url = base_url.rstrip("/")
        self.url = self.base_url + "/chat/completions"
        self.model = model
        self.name = name or model
        self.api_key = None
        if api_key_env:
            self.api_key = os.environ.get(api_key_env)
            if not self.api_key:
                raise ExpertError(
                    f"expert {self.name!r}: environment variable "
                    f"{api_key_env} is not set (pass api_key_env=None "
                    "for servers without authentication)"
                )
        self.retries = retries
        self.timeout = timeout
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.extra_body = dict(extra_body or {})
        self.max_concurrency = max_concurrency
        self.reasoning_model = reasoning_model
        self.stats = ClientStats()
        # asyncio primitives belong to one event loop; training runs one loop per step.
        self._semaphores: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def _semaphore(self) -> asyncio.Semaphore:
        loop = asyncio.get_running_loop()
        if loop not in self._semaphores:
            self._semaphores[loop] = asyncio.Semaphore(self.max_concurrency)
        return self._semaphores[loop]

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
        tools: Sequence[dict[str, Any]] | None = None,
    ) -> ExpertReply:
        """POSTs the chat request; measures latency over the successful attempt.

        `tools` (OpenAI function schemas) are sent when given; the reply's
        `tool_calls` come back in `ExpertReply.tool_calls`.
        """
        del ctx  # a real model sees only the messages
        body: dict[str, Any] = {"model": self.model, "messages": list(messages)}
        if self.reasoning_model:
            body["max_completion_tokens"] = max_tokens
        else:
            body.update(max_tokens=max_tokens, temperature=temperature)
        body.update(self.extra_body)
        if tools:
            body["tools"] = list(tools)
        last_error = "no attempt made"
        attempt = 0
        async with self._semaphore():
            for attempt in range(self.retries + 1):
                if attempt:
                    self.stats.retries += 1
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
                                reply = self._parse(text, time.monotonic() - start, attempt + 1)
                                self.stats.calls += 1
                                self.stats.prompt_tokens += reply.prompt_tokens
                                self.stats.completion_tokens += reply.completion_tokens
                                return reply
                            last_error = f"HTTP {resp.status}: {text[:300]}"
                            if resp.status not in RETRYABLE_STATUS:
                                break
                except (aiohttp.ClientError, asyncio.TimeoutError) as e:
                    last_error = f"{type(e).__name__}: {e}"
        self.stats.failures += 1
        raise ExpertError(
            f"expert {self.name!r} at {self.url} failed after "
            f"{attempt + 1} attempt(s); last error: {last_error}",
            endpoint=self.url,
        )

    def _parse(self, text: str, latency_s: float, attempts: int) -> ExpertReply:
        try:
            data = json.loads(text)
            message = data["choices"][0]["message"]
            usage = data.get("usage") or {}
            return ExpertReply(
                text=message.get("content") or "",
                prompt_tokens=int(usage.get("prompt_tokens", 0)),
                completion_tokens=int(usage.get("completion_tokens", 0)),
                latency_s=latency_s,
                tool_calls=tuple(message.get("tool_calls") or ()),
                attempts=attempts,
            )
        except (ValueError, KeyError, IndexError, TypeError, AttributeError) as e:
            self.stats.failures += 1
            raise ExpertError(
                f"expert {self.name!r}: malformed response ({type(e).__name__}: {e}): {text[:300]}",
                endpoint=self.url,
            ) from e


def probe_endpoint(
    base_url: str, *, api_key_env: str | None = None, timeout_s: float = 10.0
) -> str | None:
    """Why the OpenAI-compatible server at `base_url` cannot be used (one line), or None.

    GETs `<base_url>/models`: no answer (refused, DNS, timeout) means unreachable;
    401/403 means the key was refused; any other answer means a server is there.
    """
    request = urllib.request.Request(base_url.rstrip("/") + "/models", method="GET")
    key = os.environ.get(api_key_env) if api_key_env else None
    if key:
        request.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(request, timeout=timeout_s):
            return None
    except urllib.error.HTTPError as e:
        if e.code in (401, 403):
            return f"{base_url} refused the API key from ${api_key_env} (HTTP {e.code})"
        return None
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", e)
        return f"{base_url} is unreachable ({reason})"
