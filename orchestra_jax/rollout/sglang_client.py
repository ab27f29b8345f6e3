"""A RolloutEngine over SGLang's native HTTP API (or our own `server.py`).

Token-in/token-out: prompts go out as `input_ids`, tokens and logprobs come back
from `meta_info.output_token_logprobs` (wire format in `sglang_protocol.py`), with
the `meta_info.weight_version` that generated them.

Several servers share the work through a `ServerPool` (`server_pool.py`): every
turn of an episode goes to the server that served its previous turn and holds
its prefix (`GenerateRequest.affinity_key`), new episodes to the least loaded
server, one batched `/generate` per server and chunk of at most
`max_batch_per_request` prompts, all in flight at once. Give a single router URL
(`router_url`, or one URL) to let SGLang's router balance instead.

Failures: a connection error, timeout, 5xx or malformed reply (not JSON where its
content type says JSON, off the wire format, an output token without a
log-probability: `sglang_protocol.MalformedResponse`) is retried, on another
server when one is up, with exponential backoff (`backoff_s * 2**attempt`, at
most `max_retries` retries); after that `generate` raises `RolloutServerError`
naming every server tried and the last error, so no request is ever silently
dropped. A 4xx is the caller's fault and raises at once. `max_consecutive_errors`
failures in a row, or a failed `/health` check (every `health_interval_s`, in the
background), take a server out (its episodes move to the others); a server that
is out gets a `/health` check every `recheck_s` seconds, and once it passes and
holds the current weights (they are pushed to it if not: a restarted server
comes back with its start-up weights) it is back. Every
attempt sends fresh request ids (`<request_id>-<random>`): SGLang refuses an id
that is still in flight, which a retried or repeated agent id would be.

Weight sync: `update_weights(model, version=v)` writes HF safetensors into
`<weights_dir>/v<version>` with `save_hf_checkpoint`, then asks every server at
once to `POST /update_weights_from_disk {"model_path", "weight_version",
"abort_all_requests"}` and checks (`verify_weights`) that each reports the
version; a server that fails is taken out until it catches up, and the sync
raises `RolloutServerError` when no server took it. The server waits for (or
aborts) its requests in flight and flushes its own cache, so no extra
`/flush_cache` follows. The folder must be readable by the servers: a shared
disk, or a `gs://` URI (`orchestra_jax/io/paths.py`) for servers that load from
GCS (`rollout/server.py` does, through the same path layer; SGLang itself loads
local folders only).

Seeds: `sampling_seed` is sent with every seeded request, but SGLang applies it
only when launched with `--enable-deterministic-inference` (as
`launch/sglang_server.sh` does by default); otherwise its samples are not
reproducible, whatever the seed.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
import uuid
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, cast

import aiohttp

from orchestra_jax.rollout import sglang_protocol as proto
from orchestra_jax.rollout.engine import Completion, GenerateRequest
from orchestra_jax.rollout.server_pool import NoServerAvailable, ServerPool

if TYPE_CHECKING:
    from orchestra_jax.models.qwen3 import Qwen3ForCausalLM

log = logging.getLogger(__name__)


class RolloutServerError(RuntimeError):
    """The rollout server(s) failed or stayed unreachable after all retries."""


class _ClientError(Exception):
    """A 4xx answer: retrying will not help."""

    def __init__(self, message: str, status: int):
        super().__init__(message)
        self.status = status


def _json_body(text: str) -> Any:
    """A reply sent as JSON, decoded; MalformedResponse when it is not JSON."""
    try:
        return json.loads(text)
    except ValueError as e:
        raise proto.MalformedResponse(f"reply is not valid JSON ({e}): {text[:200]!r}") from None


def attempt_rid(request_id: str | None) -> str:
    """A request id unique to one attempt, keeping the caller's id as a readable prefix."""
    return f"{request_id or 'req'}-{uuid.uuid4().hex[:16]}"


class SGLangClient:
    """RolloutEngine over one or more SGLang-protocol servers."""

    def __init__(
        self,
        urls: str | Sequence[str] | None = None,
        *,
        router_url: str | None = None,
        timeout_s: float = 600.0,
        max_retries: int = 4,
        backoff_s: float = 0.5,
        max_batch_per_request: int = 64,
        weights_dir: str | None = None,
        model_config: Any = None,
        max_consecutive_errors: int = 3,
        recheck_s: float = 10.0,
        health_interval_s: float = 60.0,
        health_timeout_s: float = 30.0,
    ):
        if (urls is None) == (router_url is None):
            raise ValueError("give either urls (one or more servers) or router_url, not both")
        if router_url is not None:
            urls = [router_url]
        elif isinstance(urls, str):
            urls = [urls]
        else:
            urls = list(urls or ())
        if not urls:
            raise ValueError("urls is empty")
        self.urls = [u.rstrip("/") for u in urls]
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        self.backoff_s = backoff_s
        self.max_batch_per_request = max_batch_per_request
        self.weights_dir = weights_dir
        self.model_config = model_config
        self.health_timeout_s = health_timeout_s
        self.pool = ServerPool(
            self.urls,
            max_consecutive_errors=max_consecutive_errors,
            recheck_s=recheck_s,
            health_interval_s=health_interval_s,
        )
        # (folder, version) of the last weights every server was asked to load: what a
        # server coming back must hold first. None until the first sync.
        self._weights: tuple[str, int] | None = None
        self._syncing = 0  # weight syncs under way: a server's version is in flux
        self._checks: set[asyncio.Task] = set()  # health checks of servers that are out
        self._session: aiohttp.ClientSession | None = None
        self._session_loop: asyncio.AbstractEventLoop | None = None

    # -- plumbing -------------------------------------------------------------------------

    def _get_session(self) -> aiohttp.ClientSession:
        # One session per event loop; recreated if the caller's loop changed.
        loop = asyncio.get_running_loop()
        if self._session is None or self._session.closed or self._session_loop is not loop:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=self.timeout_s)
            )
            self._session_loop = loop
            self._checks = set()  # tasks of another loop are not ours to await
        return self._session

    async def aclose(self) -> None:
        """Closes the HTTP session from inside its event loop."""
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
        if session is None or session.closed or loop is None or loop.is_closed():
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
        """One `method path` on `url`: the decoded JSON (or text) body, through `parse` if
        given. Raises _ClientError on a 4xx, and aiohttp.ClientError, TimeoutError or
        MalformedResponse (a body that does not decode or that `parse` refuses) on a
        server fault."""
        timeout = aiohttp.ClientTimeout(total=timeout_s) if timeout_s is not None else None
        async with self._get_session().request(
            method, url + path, json=body, timeout=timeout
        ) as resp:
            text = await resp.text()
            if 400 <= resp.status < 500:
                raise _ClientError(
                    f"{method} {url}{path} -> {resp.status}: {text[:500]}", resp.status
                )
            if resp.status >= 500:
                raise aiohttp.ClientResponseError(
                    resp.request_info, (), status=resp.status, message=text[:500]
                )
            ctype = resp.headers.get("Content-Type", "")
            value = _json_body(text) if "json" in ctype else text
            return parse(value) if parse is not None else value

    async def _request(self, method: str, path: str, payload: Any = None, *, url: str) -> Any:
        """`method path` on `url`, retried with backoff on a server fault; raises
        RolloutServerError after the last retry and _ClientError on a 4xx."""
        errors = []
        for attempt in range(self.max_retries + 1):
            try:
                return await self._send(method, url, path, payload)
            except _SERVER_FAULTS as e:
                errors.append(_fault(url, e))
                if attempt < self.max_retries:
                    await self._backoff(f"{method} {url}{path}", e, attempt)
        raise RolloutServerError(
            f"{method} {path} failed after {self.max_retries + 1} attempts; "
            f"server {url} unreachable or failing. Errors: " + " | ".join(errors)
        )

    async def _call(self, method: str, path: str, payload: Any = None, *, url: str) -> Any:
        """`_request`, with a 4xx as RolloutServerError."""
        try:
            return await self._request(method, path, payload, url=url)
        except _ClientError as e:
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

    async def _generate_chunk(self, url: str, chunk: Sequence[GenerateRequest]) -> list[Completion]:
        """One batched /generate of `chunk` (counted in flight on `url` by the pool),
        reported to the pool and released from it however it ends."""
        start = time.perf_counter()

        def completions(body: Any) -> list[Completion]:
            if not isinstance(body, list) or len(body) != len(chunk):
                raise proto.MalformedResponse(
                    f"/generate returned {type(body).__name__} for {len(chunk)} prompts: "
                    f"{str(body)[:300]}"
                )
            latency = time.perf_counter() - start
            return [proto.completion_from_json(item, latency_s=latency) for item in body]

        payload = proto.generate_payload(chunk, [attempt_rid(r.request_id) for r in chunk])
        try:
            result = await self._send("POST", url, "/generate", payload, parse=completions)
        except _SERVER_FAULTS as e:
            self.pool.report(url, ok=False, requests=len(chunk), error=_fault(url, e))
            raise
        finally:
            for r in chunk:
                self.pool.release(url, load=_load(r))
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
        results: list[Completion | None] = [None] * len(requests)
        failed_on: list[set[str]] = [set() for _ in requests]
        pending = list(range(len(requests)))
        errors: list[str] = []
        for attempt in range(self.max_retries + 1):
            self._start_due_checks()
            routes: dict[str, list[int]] = {}
            try:
                for i in pending:
                    r = requests[i]
                    url = self.pool.choose(r.affinity_key, load=_load(r), avoid=failed_on[i])
                    routes.setdefault(url, []).append(i)
            except NoServerAvailable as e:
                for url, idx in routes.items():  # the ones chosen before it gave up
                    for i in idx:
                        self.pool.release(url, load=_load(requests[i]))
                errors.append(str(e))
                if attempt < self.max_retries:
                    await self._backoff("/generate", e, attempt)
                continue
            n = self.max_batch_per_request
            sends = [
                (url, idx[j : j + n]) for url, idx in routes.items() for j in range(0, len(idx), n)
            ]
            outcomes = await asyncio.gather(
                *(self._generate_chunk(url, [requests[i] for i in idx]) for url, idx in sends),
                return_exceptions=True,
            )
            pending = []
            for (url, idx), outcome in zip(sends, outcomes, strict=True):
                if isinstance(outcome, _ClientError):
                    raise RolloutServerError(str(outcome)) from None
                if isinstance(outcome, _SERVER_FAULTS):
                    errors.append(_fault(url, outcome))
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
                    f"/generate of {len(pending)} request(s)", Exception(errors[-1]), attempt
                )
        tried = sorted({u for s in failed_on for u in s})
        raise RolloutServerError(
            f"POST /generate failed after {self.max_retries + 1} attempts; servers "
            f"{tried or self.urls} unreachable or failing. Errors: " + " | ".join(errors)
        )

    # -- health ---------------------------------------------------------------------------

    async def _healthy(self, url: str) -> bool:
        try:
            await self._send("GET", url, "/health", timeout_s=self.health_timeout_s)
            return True
        except (*_SERVER_FAULTS, _ClientError):
            return False

    async def _check(self, url: str) -> bool:
        """Health-check `url`: readmitted if it answers and holds (or now loads) the current
        weights; else out (stale if its weights could not be brought up to date)."""
        if not await self._healthy(url):
            self.pool.mark_down(url, "failed its /health check")
            return False
        if self._weights is not None:
            path, version = self._weights
            try:
                loaded = await self._served_version(url) != str(version)
                if loaded:
                    await self._load_on(url, path, version, abort_in_flight=False)
            except (RolloutServerError, *_SERVER_FAULTS, _ClientError) as e:
                self.pool.mark_down(
                    url, f"could not load weight version {version}: {e}", stale=True
                )
                return False
            if loaded and self._weights[1] != version:  # a sync began meanwhile: catch up next time
                self.pool.mark_down(url, f"caught up to version {version}, now old", stale=True)
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

    async def get_model_info(self) -> list[dict]:
        return [await self._call("GET", "/model_info", url=u) for u in self.urls]

    async def flush_cache(self) -> bool:
        """Ask every server to drop its prefix cache; False if one refused (SGLang does
        while requests run: a race with other clients, not an error)."""
        flushed = True
        for u in self.urls:
            try:
                await self._request("POST", "/flush_cache", url=u)
            except _ClientError as e:
                log.warning("%s did not flush its cache: %s", u, e)
                flushed = False
        return flushed

    def take_metrics(self) -> dict[str, float]:
        """Per-server metrics since the previous call (`ServerPool.take_metrics`)."""
        return self.pool.take_metrics()

    # -- weights --------------------------------------------------------------------------

    async def _served_version(self, url: str) -> str | None:
        info = await self._call("GET", "/get_model_info", url=url)  # also SGLang's router's
        version = info.get("weight_version") if isinstance(info, dict) else None
        return None if version is None else str(version)

    async def weight_versions(self) -> dict[str, str | None]:
        """Each server's weight version as it reports it (None: it did not answer)."""

        async def one(url: str) -> str | None:
            try:
                return await self._served_version(url)
            except RolloutServerError:
                return None

        self._get_session()
        versions = await asyncio.gather(*(one(u) for u in self.urls))
        return dict(zip(self.urls, versions, strict=True))

    async def verify_weights(self, url: str, version: int) -> None:
        """Raises RolloutServerError unless `url` serves weight version `version`. The one
        check every sync passes through, server by server."""
        served = await self._served_version(url)
        if served != str(version):
            raise RolloutServerError(
                f"{url} reports weight version {served!r} after loading version {version}"
            )

    async def _load_on(self, url: str, model_path: str, version: int, *, abort_in_flight: bool):
        body = await self._call(
            "POST",
            "/update_weights_from_disk",
            {
                "model_path": model_path,
                "weight_version": str(version),
                "abort_all_requests": abort_in_flight,
            },
            url=url,
        )
        if not (isinstance(body, dict) and body.get("success")):
            raise RolloutServerError(f"{url} refused weights from {model_path}: {body}")
        await self.verify_weights(url, version)

    async def update_weights_from_disk(
        self, model_path: str, *, version: int, abort_in_flight: bool = False
    ) -> None:
        """Point every server that is up (all of them if none is) at HF weights in
        `model_path`, all at once, and wait until each reports `version` (each flushes
        its own cache). A server that fails, or is out, is kept out until it has caught
        up; RolloutServerError when none succeeded."""
        self._weights = (model_path, int(version))
        self._get_session()
        targets = self.pool.healthy() or list(self.urls)
        for url in self.urls:
            if url not in targets:  # loaded when its health check readmits it
                self.pool.mark_down(url, f"out during the sync to version {version}", stale=True)
        self._syncing += 1
        try:
            outcomes = await asyncio.gather(
                *(
                    self._load_on(u, model_path, version, abort_in_flight=abort_in_flight)
                    for u in targets
                ),
                return_exceptions=True,
            )
        finally:
            self._syncing -= 1
        failures = {}
        for url, outcome in zip(targets, outcomes, strict=True):
            if isinstance(outcome, (RolloutServerError, *_SERVER_FAULTS)):
                failures[url] = str(outcome) or type(outcome).__name__
                self.pool.mark_down(
                    url, f"weight sync to version {version} failed: {failures[url]}", stale=True
                )
            elif isinstance(outcome, BaseException):
                raise outcome
        self.pool.forget_affinity()  # every server flushed its cache
        if len(failures) == len(targets):
            raise RolloutServerError(
                f"weight sync to version {version} ({model_path}) failed on every server: "
                + " | ".join(f"{u}: {e}" for u, e in failures.items())
            )

    async def update_weights(
        self, model_state: Any, *, version: int, abort_in_flight: bool = False
    ) -> None:
        """Save `model_state` (a Qwen3 model or its nnx.State) as HF weights and load them."""
        if self.weights_dir is None:
            raise ValueError(
                "SGLangClient needs weights_dir (a folder the servers can read) to sync weights"
            )
        from orchestra_jax.io import paths
        from orchestra_jax.models.hf_checkpoint import prune_versions, save_hf_checkpoint
        from orchestra_jax.parallel.multihost import barrier, is_primary

        model, config = _as_model(model_state, self.model_config)
        path = paths.join(self.weights_dir, f"v{int(version)}")
        # In the compute dtype; on several hosts all gather, process 0 writes and
        # points the (shared) servers at it, the others wait for it.
        await asyncio.to_thread(save_hf_checkpoint, model, config, path, dtype=config.dtype)
        if is_primary():
            await self.update_weights_from_disk(
                os.fspath(paths.as_path(path)), version=version, abort_in_flight=abort_in_flight
            )
            prune_versions(self.weights_dir, keep=2)  # the servers' and the previous one
        barrier(f"orchestra_jax_weights_v{int(version)}")


# What a retry may cure: a connection error, a timeout, a 5xx, a malformed reply.
_SERVER_FAULTS = (
    aiohttp.ClientError,
    asyncio.TimeoutError,
    UnicodeDecodeError,
    proto.MalformedResponse,
)


def _fault(url: str, error: BaseException) -> str:
    kind = "malformed reply" if isinstance(error, proto.MalformedResponse) else ""
    return f"{url}: {kind or type(error).__name__}: {error}"


def _load(request: GenerateRequest) -> int:
    """A request's weight on its server: the tokens it may hold."""
    return len(request.input_ids) + request.sampling.max_new_tokens


def _as_model(model_state: Any, config: Any) -> tuple[Qwen3ForCausalLM, Any]:
    """(model, config) from a Qwen3 model, or from an nnx.State plus `config`."""
    from flax import nnx

    if isinstance(model_state, nnx.Module):
        return cast("Qwen3ForCausalLM", model_state), getattr(model_state, "config", config)
    if config is None:
        raise ValueError("pass model_config to SGLangClient to sync weights given as an nnx.State")
    from orchestra_jax.models.qwen3 import Qwen3ForCausalLM

    abstract = nnx.eval_shape(lambda: Qwen3ForCausalLM(config, rngs=nnx.Rngs(0)))
    graphdef, _ = nnx.split(abstract)
    return nnx.merge(graphdef, model_state), config
