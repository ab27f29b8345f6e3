"""What the HTTP rollout clients share: sessions, server choice, retries, errors.

`HttpEngineClient` holds one aiohttp session per event loop and sends each call
to one server with retries: a connection error, timeout, 5xx or malformed reply
(not JSON where its content type says JSON, or refused by the caller's parser:
`MalformedResponse`) is retried on the next server with exponential backoff
(`backoff_s * 2**attempt`, at most `max_retries` retries); after that the call
raises `RolloutServerError` naming every server tried and the last error, so no
request is ever silently dropped. A 4xx is the caller's fault and raises at
once. Which server a call goes to is `_pick_url`'s choice (round robin here).
SGLangClient (`sglang_client.py`) and VLLMClient (`vllm_client.py`) build on it.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import uuid
from collections.abc import Callable, Sequence
from typing import Any

import aiohttp

from orchestra_jax.rollout.sglang_protocol import MalformedResponse

log = logging.getLogger(__name__)


class RolloutServerError(RuntimeError):
    """The rollout server(s) failed or stayed unreachable after all retries."""


class RefusedRequest(Exception):
    """A 4xx answer: retrying will not help."""

    def __init__(self, message: str, status: int):
        super().__init__(message)
        self.status = status


def json_body(text: str) -> Any:
    """A reply sent as JSON, decoded; MalformedResponse when it is not JSON."""
    try:
        return json.loads(text)
    except ValueError as e:
        raise MalformedResponse(f"reply is not valid JSON ({e}): {text[:200]!r}") from None


def attempt_rid(request_id: str | None) -> str:
    """A request id unique to one attempt, keeping the caller's id as a readable prefix."""
    return f"{request_id or 'req'}-{uuid.uuid4().hex[:16]}"


def server_urls(urls: str | Sequence[str] | None) -> list[str]:
    """One URL or several as a list without trailing slashes; ValueError when empty."""
    listed = [urls] if isinstance(urls, str) else list(urls or ())
    if not listed:
        raise ValueError("urls is empty")
    return [u.rstrip("/") for u in listed]


class HttpEngineClient:
    """Retried JSON calls to one or more rollout servers (see the module docstring)."""

    def __init__(
        self,
        urls: Sequence[str],
        *,
        timeout_s: float = 600.0,
        max_retries: int = 4,
        backoff_s: float = 0.5,
    ):
        self.urls = server_urls(urls)
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        self.backoff_s = backoff_s
        self._next_url = itertools.cycle(range(len(self.urls)))
        self._session: aiohttp.ClientSession | None = None
        self._session_loop: asyncio.AbstractEventLoop | None = None

    def _pick_url(self, request: Any = None) -> str:
        """The server for the next attempt of a call (`request`: what it carries, if a
        generation); round robin over `urls`."""
        del request
        return self.urls[next(self._next_url)]

    def _get_session(self) -> aiohttp.ClientSession:
        # One session per event loop; recreated if the caller's loop changed.
        loop = asyncio.get_running_loop()
        if self._session is None or self._session.closed or self._session_loop is not loop:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=self.timeout_s)
            )
            self._session_loop = loop
        return self._session

    async def aclose(self) -> None:
        """Closes the HTTP session from inside its event loop."""
        if self._session is not None and not self._session.closed:
            await self._session.close()
        self._session = None

    def close(self) -> None:
        """`RolloutEngine.close`: closes the HTTP session, from any thread, with or without a
        running loop."""
        session, loop = self._session, self._session_loop
        self._session = None
        if session is None or session.closed or loop is None or loop.is_closed():
            return
        if loop.is_running():
            asyncio.run_coroutine_threadsafe(session.close(), loop)
        else:
            loop.run_until_complete(session.close())

    async def _request(
        self,
        method: str,
        path: str,
        payload: Any = None,
        *,
        url: str | None = None,
        parse: Callable[[Any], Any] | None = None,
        route: Any = None,
    ) -> Any:
        """`method path` on one server (`_pick_url(route)` unless `url`), with retries.

        `payload` may be a callable giving the body per attempt (fresh request ids).
        Returns the decoded JSON (or text) body, through `parse` if given; a body
        that does not decode, or that `parse` refuses (`MalformedResponse`), is a
        server fault like a 5xx: retried, then reported. Raises RolloutServerError
        after the last retry and RefusedRequest on a 4xx.
        """
        errors = []
        for attempt in range(self.max_retries + 1):
            base = url or self._pick_url(route)
            body = payload() if callable(payload) else payload
            try:
                async with self._get_session().request(method, base + path, json=body) as resp:
                    text = await resp.text()
                    if 400 <= resp.status < 500:
                        raise RefusedRequest(
                            f"{method} {base}{path} -> {resp.status}: {text[:500]}", resp.status
                        )
                    if resp.status >= 500:
                        raise aiohttp.ClientResponseError(
                            resp.request_info, (), status=resp.status, message=text[:500]
                        )
                    ctype = resp.headers.get("Content-Type", "")
                    value = json_body(text) if "json" in ctype else text
                    return parse(value) if parse is not None else value
            except (
                aiohttp.ClientError,
                asyncio.TimeoutError,
                UnicodeDecodeError,
                MalformedResponse,
            ) as e:
                kind = "malformed reply" if isinstance(e, MalformedResponse) else ""
                errors.append(f"{base}: {kind or type(e).__name__}: {e}")
                if attempt < self.max_retries:
                    delay = self.backoff_s * 2**attempt
                    log.warning(
                        "%s %s%s failed (%s); retry %d/%d in %.1fs",
                        method,
                        base,
                        path,
                        e,
                        attempt + 1,
                        self.max_retries,
                        delay,
                    )
                    await asyncio.sleep(delay)
        raise RolloutServerError(
            f"{method} {path} failed after {self.max_retries + 1} attempts; "
            f"servers {self.urls} unreachable or failing. Errors: " + " | ".join(errors)
        )

    async def _call(self, method: str, path: str, payload: Any = None, **kw) -> Any:
        """`_request`, with a 4xx as RolloutServerError."""
        try:
            return await self._request(method, path, payload, **kw)
        except RefusedRequest as e:
            raise RolloutServerError(str(e)) from None

    async def health(self) -> bool:
        """True when every server answers /health with 200."""

        async def one(url):
            try:
                async with self._get_session().get(
                    url + "/health", timeout=aiohttp.ClientTimeout(total=30)
                ) as resp:
                    return resp.status == 200
            except (aiohttp.ClientError, asyncio.TimeoutError):
                return False

        return all(await asyncio.gather(*(one(u) for u in self.urls)))
