"""What the HTTP rollout clients share: server choice, failover, health, weight sync.

`HttpEngineClient` is the plumbing of SGLangClient (`rollout/http/sglang_client.py`) and
VLLMClient (`rollout/http/vllm_client.py`); each implements the protocol: how one server
generates a chunk of requests (`_generate_on`), loads weights from a folder
(`_load_on`) or a LoRA adapter (`_load_adapter_on`) and reports its weight
version (`_served_version`).

Choice: several servers share the work through a `ServerPool` (`rollout/http/server_pool.py`):
every turn of an episode goes to the server that served its previous turn and
holds its prefix (`GenerateRequest.affinity_key`), new episodes to the least
loaded server; requests to one server go in chunks of at most
`max_batch_per_request`, at most `max_in_flight` chunks open at once on each
server (when set; the client's other calls, health checks and weight syncs,
never wait behind them). The session's connector sets no limit of its own, so
a call's time limit (`timeout_s`) starts when it is sent, not while it waits
for its server's turn. The time limits, retries and health-check intervals below are one
`ServerPoolSettings` (`rollout/http/server_pool_settings.py`; a config's `rollout.server_pool.*`).

Access: with an API key (read from the environment variable `api_key_env`
names, `rollout.api_key_env`, default ROLLOUT_API_KEY; unset or empty: none)
every call carries `Authorization: Bearer <key>`, as vLLM's and SGLang's
`--api-key` and `rollout/server/app.py` require.

Start-up: before the first request or sync every server passes the client's
start-up checks (`_startup_check`; vLLM's in `rollout/http/vllm_client.py`), all at once.
With `max_context_tokens` (the agent's `agent.max_context_tokens`) each server
must serve at least that context: `GET /v1/models` reports it as
`max_model_len` (vLLM, SGLang and `rollout/server/app.py` alike); a shorter one
raises RolloutServerError naming both numbers, one that reports none is logged
and not checked. A server that does not answer within the retries is taken out
(logged, naming it) and the others serve; when none answers, `check_servers`
raises `ServerUnreachable` (a `RolloutServerError`) naming each. A server that
answers but fails a check raises `RolloutServerError` saying what is wrong.
Without `max_context_tokens` SGLang's client checks nothing at start-up: a
server that does not answer is taken out by the first weight sync (the sync
goes on with the others) or by `max_consecutive_errors` failed requests
(retried on the others).

Failures: a connection error, timeout, 5xx or malformed reply (not JSON where
its content type says JSON, or refused by the protocol's parser:
`MalformedResponse`) is retried, on another server when one is up, with
exponential backoff (`backoff_s * 2**attempt`, at most `max_retries` retries);
after that `generate` raises `RolloutServerError` naming every server tried and
the last error, so no request is ever silently dropped. A 4xx is the caller's
fault and raises at once, except a refusal for context length (a 400 saying
the prompt plus max_new_tokens exceed the server's context, as vLLM, SGLang and
`rollout/server/app.py` word it): that request gets a Completion with finish
reason "context" and no tokens (the agent loop ends the episode as the
policy's context stop, not as a failure of the server), and the others of its
chunk are sent again on their own. `max_consecutive_errors` failures in a row, or a
failed `/health` check (every `health_interval_s`, in the background), take a
server out (its episodes move to the others); a server that is out gets a
`/health` check every `recheck_s` seconds, and once it passes and holds the
current weights (they are loaded on it if not: a restarted server comes back
with its start-up weights), after passing the start-up checks if it never did,
it is back. A server comes back only through `verify_weights`: the sync probe
of the current version, even when it already reports that version, and only
if no weight sync began while it was being checked (then it stays out, stale,
and the next check catches it up).

Weight sync: `update_weights(model, version=v)` writes HF safetensors in the
compute (serving) dtype into `<weights_dir>/v<version>` (`save_hf_checkpoint`;
the last two versions stay), loads them on every server that is up, all at
once, and passes each server through `verify_weights`: it must report version
v and, when the sync came with the learner's model, pass the sync probe
(`rollout/http/sync_probe.py`: its log-probs of a fixed sequence match the learner's). A
server that fails is taken out until it has caught up (the same load and
verify); the sync raises `SyncNotLanded` when every server failed the probe or
the version check, `RolloutServerError` when none took the weights for another
reason. `sync_metrics()` gives the last sync's probe difference. The folder
must be readable by the servers (a shared disk, or `gs://` for servers that
load from GCS).

Weight sync by adapter: when the model carries LoRA adapters (its config's
`lora`, `models/lora.py`), the servers hold the frozen base from their start
and each sync writes only the adapters, as a PEFT folder
(`models/peft_adapter.save_adapter`), into `<weights_dir>/v<version>`; each
server loads it under the versioned name `adapter_name(version)`
("policy-v<version>"), labels its weights `version`, and requests from then on
name that adapter; the same `verify_weights` follows (the probe scored with the
adapter, against the learner with adapters on), and each server keeps the two
adapters it loaded last (the new one and the one requests in flight may still
name), unloading older ones. The first sync of a run sends fresh adapters
(B = 0: base + adapter = base), so its probe also checks that the servers hold
the learner's base.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import json
import logging
import os
import re
import time
import uuid
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, cast

import aiohttp
import numpy as np

from orchestra_jax.infra_failure import ServiceError
from orchestra_jax.rollout.engine import Completion, GenerateRequest
from orchestra_jax.rollout.http import sync_probe
from orchestra_jax.rollout.http.server_pool import NoServerAvailable, ServerPool
from orchestra_jax.rollout.http.server_pool_settings import ServerPoolSettings
from orchestra_jax.rollout.http.sglang_protocol import MalformedResponse
from orchestra_jax.rollout.http.sync_probe import SyncNotLanded

if TYPE_CHECKING:
    from orchestra_jax.models.qwen3.model import Qwen3ForCausalLM

log = logging.getLogger(__name__)


class RolloutServerError(ServiceError):
    """The rollout server(s) failed or stayed unreachable after all retries."""


class ServerUnreachable(RolloutServerError):
    """A server that did not answer within the retries."""


class RefusedRequest(Exception):
    """A 4xx answer: retrying will not help."""

    def __init__(self, message: str, status: int):
        super().__init__(message)
        self.status = status


DEFAULT_API_KEY_ENV = "ROLLOUT_API_KEY"  # rollout.api_key_env's default

# How vLLM, SGLang and rollout/server/app.py word a refusal for context length (400).
_CONTEXT_REFUSAL = re.compile(r"context length|maximum model length", re.IGNORECASE)


def refused_for_context(error: RefusedRequest) -> bool:
    """Whether a 4xx says the prompt plus max_new_tokens exceed the server's context."""
    return error.status == 400 and bool(_CONTEXT_REFUSAL.search(str(error)))


def context_refusal(request: GenerateRequest) -> Completion:
    """The completion of a request a server refused for context length: no tokens,
    finish reason "context"."""
    return Completion(
        output_ids=[],
        logprobs=[],
        finish_reason="context",
        prompt_tokens=len(request.input_ids),
        completion_tokens=0,
        latency_s=0.0,
    )


def served_context(models: Any) -> int | None:
    """The context a server reports on `GET /v1/models` (its first model's
    `max_model_len`); None when it reports none."""
    cards = models.get("data") if isinstance(models, dict) else None
    if not isinstance(cards, list) or not cards or not isinstance(cards[0], dict):
        return None
    value = cards[0].get("max_model_len")
    return value if isinstance(value, int) and not isinstance(value, bool) else None


# What a retry may cure: a connection error, a timeout, a 5xx, a malformed reply.
SERVER_FAULTS = (aiohttp.ClientError, asyncio.TimeoutError, UnicodeDecodeError, MalformedResponse)


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


def fault(url: str, error: BaseException) -> str:
    """A server fault as one line naming the server."""
    kind = "malformed reply" if isinstance(error, MalformedResponse) else ""
    return f"{url}: {kind or type(error).__name__}: {error}"


def request_load(request: GenerateRequest) -> int:
    """A request's weight on its server: the tokens it may hold."""
    return len(request.input_ids) + request.sampling.max_new_tokens


def as_model(model_state: Any, config: Any) -> tuple[Qwen3ForCausalLM, Any]:
    """(model, config) from a Qwen3 model, or from an nnx.State plus `config`."""
    from flax import nnx

    if isinstance(model_state, nnx.Module):
        return cast("Qwen3ForCausalLM", model_state), getattr(model_state, "config", config)
    if config is None:
        raise ValueError("pass model_config to the client to sync weights given as an nnx.State")
    from orchestra_jax.models.qwen3.model import Qwen3ForCausalLM

    abstract = nnx.eval_shape(lambda: Qwen3ForCausalLM(config, rngs=nnx.Rngs(0)))
    graphdef, _ = nnx.split(abstract)
    return nnx.merge(graphdef, model_state), config


ADAPTER_PREFIX = "policy-v"  # the served name of the adapter of weight version v: policy-v<v>
ADAPTERS_KEPT = 2  # adapters a server keeps loaded: the synced one and the one before it


def adapter_name(version: int) -> str:
    """The name a server serves the adapter of weight version `version` under."""
    return f"{ADAPTER_PREFIX}{int(version)}"


@dataclasses.dataclass
class _Probe:
    """The sync probe of one weight version: the sequence and the learner's log-probs."""

    version: int
    ids: list[int]
    expected: np.ndarray
    limit: float  # the largest difference a server may show
    dtype: str  # the compute dtype's name
    worst: float = 0.0  # the largest difference a server showed


def _loop_ended(loop: asyncio.AbstractEventLoop | None) -> bool:
    return loop is None or loop.is_closed()


def _close_on_a_fresh_loop(session: aiohttp.ClientSession) -> None:
    """Closes a session whose event loop has ended, from a thread with or without a
    running loop (aiohttp then only marks it closed)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        asyncio.run(session.close())
        return
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        pool.submit(asyncio.run, session.close()).result()


class HttpEngineClient:
    """RolloutEngine plumbing over one or more HTTP inference servers (module docstring);
    subclasses implement `_generate_on`, `_load_on`, `_served_version` and, to sync
    LoRA adapters, `_load_adapter_on` and `_unload_adapter_on`."""

    # Calls open at once when `settings.max_in_flight` is 0 (None: every chunk).
    default_max_in_flight: int | None = None

    def __init__(
        self,
        urls: str | Sequence[str] | None,
        *,
        settings: ServerPoolSettings | None = None,
        max_batch_per_request: int = 64,
        weights_dir: str | None = None,
        model_config: Any = None,
        sync_tolerance: float | None = None,
        api_key_env: str | None = DEFAULT_API_KEY_ENV,
        max_context_tokens: int | None = None,
    ):
        self.urls = server_urls(urls)
        self.api_key_env = api_key_env or None
        # None when the variable is unset or empty: no key is sent.
        self.api_key = (os.environ.get(api_key_env) or None) if api_key_env else None
        self.max_context_tokens = max_context_tokens
        self.settings = settings = settings or ServerPoolSettings()
        self.timeout_s = settings.timeout_s
        self.max_retries = settings.max_retries
        self.backoff_s = settings.backoff_s
        self.health_timeout_s = settings.health_timeout_s
        self.max_batch_per_request = max_batch_per_request
        self.max_in_flight = settings.max_in_flight or self.default_max_in_flight
        self.weights_dir = weights_dir
        self.model_config = model_config
        self.sync_tolerance = sync_tolerance  # None: the probe's tolerance for the dtype
        self.pool = ServerPool(
            self.urls,
            max_consecutive_errors=settings.max_consecutive_errors,
            recheck_s=settings.recheck_s,
            health_interval_s=settings.health_interval_s,
        )
        # (folder, version) of the last weights every server was asked to load: what a
        # server coming back must hold first. None until the first sync.
        self._weights: tuple[str, int] | None = None
        # The policy's LoRA spec when syncs send adapters (the model config's, or the
        # synced model's), else None: syncs send full weights.
        self.lora = getattr(model_config, "lora", None)
        # Per server, the adapters this client loaded there and did not unload, oldest first.
        self._adapters_on: dict[str, list[str]] = {}
        self._probe: _Probe | None = None  # the last sync's, when it came with a model
        self._sync_metrics: dict[str, float] = {}
        self._syncing = 0  # weight syncs under way: a server's version is in flux
        self._checks: set[asyncio.Task] = set()  # health checks of servers that are out
        self._admitted: set[str] = set()  # servers that passed the start-up checks
        self._started = False  # every server checked once (`check_servers`)
        self._start_up: asyncio.Task | None = None
        self._session: aiohttp.ClientSession | None = None
        self._session_loop: asyncio.AbstractEventLoop | None = None
        # Per server, the generate calls it may have open at once (`max_in_flight`);
        # made with the session, for its event loop.
        self._gates: dict[str, asyncio.Semaphore] = {}
        self._closing: set[asyncio.Task] = set()  # sessions of ended loops being closed

    # -- the protocol: each client implements these ------------------------------------

    async def _generate_on(self, url: str, chunk: Sequence[GenerateRequest]) -> list[Completion]:
        """`chunk` answered by server `url`, one attempt: raises RefusedRequest on a 4xx
        and one of SERVER_FAULTS on a server fault."""
        raise NotImplementedError

    async def _load_on(self, url: str, model_path: str, version: int, *, mode: str) -> None:
        """Server `url` loads the HF weights in `model_path` as `version`; requests in
        flight `mode`: "wait" (finish first), "abort", "keep" (continue on the new
        weights). Raises RolloutServerError (or a server fault) when it did not."""
        raise NotImplementedError

    async def _served_version(self, url: str) -> str | None:
        """The weight version server `url` reports (None: none)."""
        raise NotImplementedError

    async def _load_adapter_on(self, url: str, adapter_path: str, version: int, *, mode: str):
        """Server `url` loads the PEFT adapter in `adapter_path` beside its base under
        `adapter_name(version)` and reports weight version `version`; requests in flight
        `mode` as in `_load_on`. Raises RolloutServerError (or a server fault) when it
        did not."""
        raise RolloutServerError(f"{type(self).__name__} does not sync LoRA adapters")

    async def _unload_adapter_on(self, url: str, name: str) -> None:
        """Server `url` drops the adapter it serves as `name`."""
        raise NotImplementedError

    def served_adapter(self, version: int | None) -> str | None:
        """The adapter requests name to be served by weight version `version`: None when
        syncs send full weights, or before the first sync (the servers' base)."""
        if self.lora is None or version is None:
            return None
        return adapter_name(version)

    async def _score_on(self, url: str, request: GenerateRequest) -> Completion:
        """The sync probe's `request` answered by `url` (`_generate_on`, by default)."""
        return (await self._generate_on(url, [request]))[0]

    async def _startup_check(self, url: str) -> None:
        """What server `url` must pass before it serves, beyond answering /health: here,
        with `max_context_tokens`, the context it serves (`_check_context`). Raises
        ServerUnreachable when it does not answer, RolloutServerError naming what is
        wrong with it otherwise."""
        if self.max_context_tokens is None:
            return
        self._check_context(url, await self._models(url))

    async def _models(self, url: str) -> Any:
        """`GET /v1/models` on `url`, retried: ServerUnreachable when it never answers,
        RolloutServerError when it refuses (an API key it does not take, named)."""
        try:
            return await self._request("GET", "/v1/models", url=url)
        except RefusedRequest as e:
            hint = ""
            if e.status == 401:
                hint = (
                    f": it requires an API key, and ${self.api_key_env} does not hold it "
                    "(rollout.api_key_env names the variable; launch/README.md)"
                    if self.api_key_env
                    else ": it requires an API key (set rollout.api_key_env)"
                )
            raise RolloutServerError(f"{url} refused GET /v1/models: {e}{hint}") from None
        except RolloutServerError as e:
            raise ServerUnreachable(str(e)) from None

    def _check_context(self, url: str, models: Any) -> None:
        """RolloutServerError when `url`'s reported context (`served_context(models)`)
        is shorter than `max_context_tokens`."""
        if self.max_context_tokens is None:
            return
        served = served_context(models)
        if served is None:
            log.warning(
                "%s reports no max_model_len on /v1/models: its context is not checked "
                "against agent.max_context_tokens=%d",
                url,
                self.max_context_tokens,
            )
            return
        if served < self.max_context_tokens:
            raise RolloutServerError(
                f"{url} serves a context of {served} tokens (max_model_len), shorter than "
                f"agent.max_context_tokens={self.max_context_tokens}: every longer episode "
                "would be refused. Start the server with a context of at least "
                f"{self.max_context_tokens} (vLLM: MAX_MODEL_LEN, SGLang: CONTEXT_LENGTH in "
                "launch/*_server.sh; rollout/server/app.py: --max-seq-len), or lower "
                "agent.max_context_tokens"
            )

    # -- start-up --------------------------------------------------------------------------

    async def _ready(self) -> None:
        """Before the first request or sync: `check_servers`."""
        await self.check_servers()

    async def check_servers(self) -> None:
        """Every server passes `_startup_check`, once per client, all at once (concurrent
        callers wait for the same check). A server that does not answer within the retries
        is taken out (stale: it serves nothing until a health check finds it answering, it
        passes the checks and loads the current weights); raises ServerUnreachable naming
        every server when none answered, and RolloutServerError when a server answered
        but failed a check."""
        if self._started:
            return
        loop = asyncio.get_running_loop()
        task = self._start_up
        if task is None or task.get_loop() is not loop or task.cancelled():
            task = self._start_up = loop.create_task(self._check_all())
        try:
            await asyncio.shield(task)
        except BaseException:
            if self._start_up is task and task.done():
                self._start_up = None  # failed: the next call checks again
            raise

    async def _check_all(self) -> None:
        self._get_session()
        outcomes = await asyncio.gather(
            *(self._admit(u) for u in self.urls), return_exceptions=True
        )
        unreachable: dict[str, ServerUnreachable] = {}
        for url, outcome in zip(self.urls, outcomes, strict=True):
            if isinstance(outcome, ServerUnreachable):
                unreachable[url] = outcome
            elif isinstance(outcome, BaseException):
                raise outcome
        if len(unreachable) == len(self.urls):
            raise ServerUnreachable(
                "no rollout server answered at start-up: "
                + " | ".join(f"{u}: {e}" for u, e in unreachable.items())
            )
        for url, error in unreachable.items():
            self.pool.mark_down(url, f"did not answer at start-up: {error}", stale=True)
        self._started = True

    async def _admit(self, url: str) -> None:
        """`_startup_check(url)`, once per server that passes it."""
        if url not in self._admitted:
            await self._startup_check(url)
            self._admitted.add(url)

    # -- plumbing ------------------------------------------------------------------------

    def _get_session(self) -> aiohttp.ClientSession:
        # One session per event loop; recreated if the caller's loop changed.
        loop = asyncio.get_running_loop()
        if self._session is None or self._session.closed or self._session_loop is not loop:
            if self._session is not None and _loop_ended(self._session_loop):
                # The previous caller's loop ended (asyncio.run returned) and its
                # connections with it; closing that session from this loop only
                # settles its bookkeeping (aiohttp touches no closed loop).
                closing = loop.create_task(self._session.close())
                self._closing.add(closing)
                closing.add_done_callback(self._closing.discard)
            # No connector limit (aiohttp's default is 100 connections in all): the
            # per-server gates bound generate calls, and a call's time limit starts
            # when it is sent, never while it queues for a connection.
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=self.timeout_s),
                connector=aiohttp.TCPConnector(limit=0, limit_per_host=0),
                headers={"Authorization": f"Bearer {self.api_key}"} if self.api_key else None,
            )
            self._session_loop = loop
            self._gates = {}
            self._checks = set()  # tasks of another loop are not ours to await
        return self._session

    async def aclose(self) -> None:
        """Closes the HTTP session (and stops health checks) from inside its event loop."""
        if self._start_up is not None and not self._start_up.done():
            self._start_up.cancel()
        for task in list(self._checks):
            task.cancel()
        if self._checks:
            await asyncio.gather(*self._checks, return_exceptions=True)
        if self._session is not None and not self._session.closed:
            await self._session.close()
        self._session = None

    def close(self) -> None:
        """`RolloutEngine.close`: closes the HTTP session, from any thread, with or without a
        running loop."""
        session, loop = self._session, self._session_loop
        self._session = None
        if session is None or session.closed:
            return
        if loop is None or loop.is_closed():
            _close_on_a_fresh_loop(session)
            return
        if loop.is_running():
            asyncio.run_coroutine_threadsafe(session.close(), loop)
        else:
            loop.run_until_complete(session.close())

    async def _send(
        self,
        method: str,
        url: str,
        path: str,
        body: Any = None,
        *,
        parse: Callable[[Any], Any] | None = None,
        timeout_s: float | None = None,
    ) -> Any:
        """One `method path` on `url` within `timeout_s` (default: `self.timeout_s`) from
        when it is sent: the decoded JSON (or text) body, through `parse` if given. Raises RefusedRequest on a 4xx, and one of SERVER_FAULTS (a body that does
        not decode or that `parse` refuses: MalformedResponse) on a server fault."""
        # Always explicit: aiohttp reads `timeout=None` as no limit at all.
        timeout = aiohttp.ClientTimeout(total=self.timeout_s if timeout_s is None else timeout_s)
        async with self._get_session().request(
            method, url + path, json=body, timeout=timeout
        ) as resp:
            text = await resp.text()
            if 400 <= resp.status < 500:
                raise RefusedRequest(
                    f"{method} {url}{path} -> {resp.status}: {text[:500]}", resp.status
                )
            if resp.status >= 500:
                raise aiohttp.ClientResponseError(
                    resp.request_info, (), status=resp.status, message=text[:500]
                )
            ctype = resp.headers.get("Content-Type", "")
            value = json_body(text) if "json" in ctype else text
            return parse(value) if parse is not None else value

    async def _request(
        self,
        method: str,
        path: str,
        payload: Any = None,
        *,
        url: str,
        parse: Callable[[Any], Any] | None = None,
    ) -> Any:
        """`method path` on `url`, retried with backoff on a server fault; raises
        RolloutServerError after the last retry and RefusedRequest on a 4xx."""
        errors = []
        for attempt in range(self.max_retries + 1):
            try:
                return await self._send(method, url, path, payload, parse=parse)
            except SERVER_FAULTS as e:
                errors.append(fault(url, e))
                if attempt < self.max_retries:
                    await self._backoff(f"{method} {url}{path}", e, attempt)
        raise RolloutServerError(
            f"{method} {path} failed after {self.max_retries + 1} attempts; "
            f"server {url} unreachable or failing. Errors: " + " | ".join(errors)
        )

    async def _call(self, method: str, path: str, payload: Any = None, **kw) -> Any:
        """`_request`, with a 4xx as RolloutServerError."""
        try:
            return await self._request(method, path, payload, **kw)
        except RefusedRequest as e:
            raise RolloutServerError(str(e)) from None

    async def _backoff(self, what: str, error: BaseException, attempt: int) -> None:
        delay = self.backoff_s * 2**attempt
        log.warning(
            "%s failed (%s); retry %d/%d in %.1fs",
            what,
            error,
            attempt + 1,
            self.max_retries,
            delay,
        )
        await asyncio.sleep(delay)

    # -- RolloutEngine ----------------------------------------------------------------------

    def _gate(self, url: str) -> asyncio.Semaphore | None:
        """The bound on `url`'s open generate calls (None: `max_in_flight` unset)."""
        if not self.max_in_flight:
            return None
        self._get_session()  # the gates belong to the session's event loop
        gate = self._gates.get(url)
        if gate is None:
            gate = self._gates[url] = asyncio.Semaphore(self.max_in_flight)
        return gate

    async def _generate_chunk(self, url: str, chunk: Sequence[GenerateRequest]) -> list[Completion]:
        """`_served_chunk` (counted in flight on `url` by the pool), released from the
        pool however it ends."""
        try:
            return await self._served_chunk(url, chunk)
        finally:
            for r in chunk:
                self.pool.release(url, load=request_load(r))

    async def _served_chunk(self, url: str, chunk: Sequence[GenerateRequest]) -> list[Completion]:
        """`_generate_on` once `url`'s gate lets it (the time limit starts then), reported
        to the pool; a refusal for context length answers a lone request with
        `context_refusal` and sends a chunk's requests again one by one."""
        gate = self._gate(url)
        if gate is not None:
            await gate.acquire()
        start = time.perf_counter()
        try:
            result = await self._generate_on(url, chunk)
        except RefusedRequest as e:
            if not refused_for_context(e):
                raise
            if gate is not None:
                gate.release()
                gate = None
            if len(chunk) == 1:
                return [context_refusal(chunk[0])]
            parts = await asyncio.gather(
                *(self._served_chunk(url, [r]) for r in chunk), return_exceptions=True
            )
            for part in parts:
                if isinstance(part, BaseException):
                    raise part from None
            return [c for part in cast("list[list[Completion]]", parts) for c in part]
        except SERVER_FAULTS as e:
            self.pool.report(url, ok=False, requests=len(chunk), error=fault(url, e))
            raise
        finally:
            if gate is not None:
                gate.release()
        self.pool.report(
            url,
            ok=True,
            requests=len(chunk),
            latency_s=time.perf_counter() - start,
            tokens=sum(c.prompt_tokens + c.completion_tokens for c in result),
            cached_tokens=sum(c.cached_tokens for c in result),
        )
        return result

    async def generate(self, requests: Sequence[GenerateRequest]) -> list[Completion]:
        """Completions in request order; raises RolloutServerError if a request still
        fails after the retries (on other servers where any is up)."""
        if any(r.constraint is not None for r in requests):
            raise ValueError(
                "a request with a token constraint (GenerateRequest.constraint, e.g. "
                "agent.constrain_enum_arguments) needs the JAX engine: the HTTP engines "
                "do not follow one"
            )
        await self._ready()
        results: list[Completion | None] = [None] * len(requests)
        failed_on: list[set[str]] = [set() for _ in requests]
        pending = list(range(len(requests)))
        errors: list[str] = []

        async def send(url: str, idx: list[int]) -> list[Completion]:
            return await self._generate_chunk(url, [requests[i] for i in idx])

        for attempt in range(self.max_retries + 1):
            self._start_due_checks()
            routes: dict[str, list[int]] = {}
            try:
                for i in pending:
                    r = requests[i]
                    url = self.pool.choose(r.affinity_key, load=request_load(r), avoid=failed_on[i])
                    routes.setdefault(url, []).append(i)
            except NoServerAvailable as e:
                for url, idx in routes.items():  # the ones chosen before it gave up
                    for i in idx:
                        self.pool.release(url, load=request_load(requests[i]))
                errors.append(str(e))
                if attempt < self.max_retries:
                    await self._backoff("generate", e, attempt)
                continue
            n = self.max_batch_per_request
            sends = [
                (url, idx[j : j + n]) for url, idx in routes.items() for j in range(0, len(idx), n)
            ]
            outcomes = await asyncio.gather(
                *(send(url, idx) for url, idx in sends), return_exceptions=True
            )
            pending = []
            for (url, idx), outcome in zip(sends, outcomes, strict=True):
                if isinstance(outcome, RefusedRequest):
                    raise RolloutServerError(str(outcome)) from None
                if isinstance(outcome, SERVER_FAULTS):
                    errors.append(fault(url, outcome))
                    for i in idx:
                        failed_on[i].add(url)
                    pending += idx
                elif isinstance(outcome, BaseException):
                    raise outcome  # cancellation, a bug: not a server fault
                else:
                    for i, c in zip(idx, outcome, strict=True):
                        results[i] = c
            if not pending:
                return cast("list[Completion]", results)
            if attempt < self.max_retries:
                await self._backoff(
                    f"generate of {len(pending)} request(s)", Exception(errors[-1]), attempt
                )
        tried = sorted({u for s in failed_on for u in s})
        raise RolloutServerError(
            f"generate failed after {self.max_retries + 1} attempts; servers "
            f"{tried or self.urls} unreachable or failing. Errors: " + " | ".join(errors)
        )

    def take_metrics(self) -> dict[str, float]:
        """Per-server metrics since the previous call (`ServerPool.take_metrics`)."""
        return self.pool.take_metrics()

    # -- health ---------------------------------------------------------------------------

    async def _healthy(self, url: str) -> bool:
        try:
            await self._send("GET", url, "/health", timeout_s=self.health_timeout_s)
            return True
        except (*SERVER_FAULTS, RefusedRequest):
            return False

    async def _check(self, url: str) -> bool:
        """Health-check `url`: readmitted if it answers and passes `verify_weights` on the
        current weights (loading them first when it reports another version; probed
        even when it reports the current one, if it is out), and no weight sync began
        meanwhile; else out (stale if its weights could not be brought up to date)."""
        if not await self._healthy(url):
            self.pool.mark_down(url, "failed its /health check")
            return False
        try:
            await self._admit(url)
        except (RolloutServerError, *SERVER_FAULTS, RefusedRequest) as e:
            self.pool.mark_down(url, f"failed its start-up checks: {e}", stale=True)
            return False
        weights = self._weights
        if weights is not None:
            path, version = weights
            out = url not in self.pool.healthy()
            try:
                if await self._served_version(url) != str(version):
                    await self._load_and_verify(url, path, version, "wait")
                elif out:  # its label alone does not bring it back: the probe does
                    await self.verify_weights(url, version)
            except (RolloutServerError, SyncNotLanded, *SERVER_FAULTS, RefusedRequest) as e:
                self.pool.mark_down(
                    url, f"could not load weight version {version}: {e}", stale=True
                )
                return False
        if self._weights != weights:  # a sync began while this check awaited the server
            if url not in self.pool.healthy():
                self.pool.mark_down(
                    url, f"checked at weight version {weights and weights[1]}, now old", stale=True
                )
            return False
        self.pool.readmit(url)
        return True

    def _start_due_checks(self) -> None:
        """The health checks that are due, in the background (none during a weight sync)."""
        if self._syncing:
            return
        for url in self.pool.due_for_check():
            task = asyncio.get_running_loop().create_task(self._check(url))
            self._checks.add(task)
            task.add_done_callback(self._checks.discard)

    async def health(self) -> bool:
        """Checks every server now (taking out those that fail, readmitting those that pass);
        True when every server is healthy."""
        self._get_session()
        return all(await asyncio.gather(*(self._check(u) for u in self.urls)))

    # -- weights --------------------------------------------------------------------------

    async def weight_versions(self) -> dict[str, str | None]:
        """Each server's weight version as it reports it (None: it did not answer)."""

        async def one(url: str) -> str | None:
            try:
                return await self._served_version(url)
            except (RolloutServerError, *SERVER_FAULTS):
                return None

        self._get_session()
        versions = await asyncio.gather(*(one(u) for u in self.urls))
        return dict(zip(self.urls, versions, strict=True))

    async def verify_weights(self, url: str, version: int) -> None:
        """The one check every sync passes through, server by server: raises SyncNotLanded
        unless `url` reports weight version `version` and, when that version's sync came
        with the learner's model, scores the probe sequence as the learner does."""
        served = await self._served_version(url)
        if served != str(version):
            raise SyncNotLanded(
                f"{url} serves weight version {served!r} after the sync to version "
                f"{version}: the weights did not land"
            )
        probe = self._probe
        if probe is None or probe.version != version:
            return
        completion = await self._score_on(url, sync_probe.probe_request(probe.ids))
        diff = sync_probe.probe_difference(url, completion, probe.expected)
        if not diff <= probe.limit:  # NaN fails too
            raise SyncNotLanded(
                f"{url} serves weight version {version}, but its log-probs of the probe "
                f"sequence differ from the learner's by up to {diff:.3g} (tolerance "
                f"{probe.limit:.3g} for {probe.dtype}): the served weights are not the learner's"
            )
        probe.worst = max(probe.worst, diff)

    def sync_metrics(self) -> dict[str, float]:
        """The last probed sync's largest |served − learner| probe log-prob over the servers
        that took it ({} before one)."""
        return dict(self._sync_metrics)

    async def _load(self, url: str, path: str, version: int, *, mode: str) -> None:
        """`url` loads the full weights, or with LoRA the adapter, in `path` as `version`."""
        if self.lora is None:
            await self._load_on(url, path, version, mode=mode)
            return
        await self._load_adapter_on(url, path, version, mode=mode)
        held = self._adapters_on.setdefault(url, [])
        name = adapter_name(version)
        if name in held:
            held.remove(name)
        held.append(name)

    async def _drop_old_adapters(self, url: str) -> None:
        """`url` unloads the adapters this client loaded there but the last
        `ADAPTERS_KEPT`; one it fails to unload only costs its memory (logged)."""
        held = self._adapters_on.get(url, [])
        while len(held) > ADAPTERS_KEPT:
            name = held.pop(0)
            try:
                await self._unload_adapter_on(url, name)
            except (RolloutServerError, RefusedRequest, *SERVER_FAULTS) as e:
                log.warning("%s did not unload adapter %s: %s", url, name, e)

    async def _load_and_verify(self, url: str, model_path: str, version: int, mode: str):
        await self._load(url, model_path, version, mode=mode)
        await self.verify_weights(url, version)
        if self.lora is not None:
            await self._drop_old_adapters(url)

    async def sync_from_disk(self, model_path: str, *, version: int, mode: str = "wait") -> None:
        """Every server that is up (all of them if none is) loads the HF weights in
        `model_path` as `version`, all at once, and passes `verify_weights`. A server
        that fails, or is out, is kept out until it has caught up; raises when none
        succeeded (module docstring)."""
        await self._ready()
        self._weights = (model_path, int(version))
        targets = self.pool.healthy() or list(self.urls)
        for url in self.urls:
            if url not in targets:  # loaded when its health check readmits it
                self.pool.mark_down(url, f"out during the sync to version {version}", stale=True)
        self._syncing += 1
        try:
            outcomes = await asyncio.gather(
                *(self._load_and_verify(u, model_path, int(version), mode) for u in targets),
                return_exceptions=True,
            )
        finally:
            self._syncing -= 1
        failures: dict[str, BaseException] = {}
        for url, outcome in zip(targets, outcomes, strict=True):
            if isinstance(
                outcome, (RolloutServerError, SyncNotLanded, RefusedRequest, *SERVER_FAULTS)
            ):
                failures[url] = outcome
                self.pool.mark_down(
                    url,
                    f"weight sync to version {version} failed: {outcome or type(outcome).__name__}",
                    stale=True,
                )
            elif isinstance(outcome, BaseException):
                raise outcome
        self.pool.forget_affinity()  # every server dropped (or may not reuse) its cache
        if len(failures) == len(targets):
            kind = (
                SyncNotLanded
                if all(isinstance(e, SyncNotLanded) for e in failures.values())
                else RolloutServerError
            )
            raise kind(
                f"weight sync to version {version} ({model_path}) failed on every server: "
                + " | ".join(f"{u}: {e}" for u, e in failures.items())
            )
        probe = self._probe
        if probe is not None and probe.version == version:
            self._sync_metrics = {"rollout/sync_logprob_max_abs_diff": probe.worst}

    async def update_weights(
        self, model_state: Any, *, version: int, abort_in_flight: bool = False
    ) -> None:
        """Save `model_state` (a Qwen3 model or its nnx.State) as HF weights, or with LoRA
        its adapters, and load them on every server (module docstring)."""
        await self._save_and_sync(
            model_state, version=version, mode="abort" if abort_in_flight else "wait"
        )

    async def _save_and_sync(self, model_state: Any, *, version: int, mode: str) -> None:
        if self.weights_dir is None:
            raise ValueError(
                f"{type(self).__name__} needs weights_dir (a folder the servers can read) "
                "to sync weights"
            )
        from orchestra_jax.io import paths
        from orchestra_jax.models.hf_checkpoint import prune_versions, save_hf_checkpoint
        from orchestra_jax.models.peft_adapter import save_adapter
        from orchestra_jax.parallel.multihost import barrier, is_primary

        model, config = as_model(model_state, self.model_config)
        if config.lora != self.lora:
            if self._weights is not None:
                raise ValueError(
                    f"update_weights: the model's lora is {config.lora}, the earlier syncs' "
                    f"{self.lora}: a client syncs either full weights or adapters of one spec"
                )
            self.lora = config.lora
        await self._ready()
        path = paths.join(self.weights_dir, f"v{int(version)}")
        # Full weights in the compute dtype, or the adapters (float32) as a PEFT folder;
        # on several hosts all gather, process 0 writes and loads the (shared) servers,
        # the others wait for it.
        if self.lora is None:
            await asyncio.to_thread(save_hf_checkpoint, model, config, path, dtype=config.dtype)
        else:
            await asyncio.to_thread(save_adapter, model, path)
        if is_primary():
            self._probe = await asyncio.to_thread(self._make_probe, model, config, int(version))
            await self.sync_from_disk(
                os.fspath(paths.as_path(path)), version=int(version), mode=mode
            )
            prune_versions(self.weights_dir, keep=2)  # the servers' and the previous one
        barrier(f"orchestra_jax_weights_v{int(version)}")

    def _make_probe(self, model: Any, config: Any, version: int) -> _Probe:
        import jax.numpy as jnp

        limit = self.sync_tolerance or sync_probe.tolerance_for(config.dtype)
        ids = sync_probe.probe_ids(config.vocab_size)
        expected = sync_probe.learner_logprobs(model, ids)
        return _Probe(version, ids, expected, limit, jnp.dtype(config.dtype).name)
