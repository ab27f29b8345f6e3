"""The HTTP face of an `Orchestrator`: OpenAI chat completions, plain and streamed.

Routes, access, limits and the event stream are docs/serving.md's; this module is
that contract's implementation. The access rules are the rollout server's, from
one module (`rollout/server/access.py`): loopback unless told otherwise, `Authorization: Bearer
<key>` on every route (here: but the page) when a key is set, a key required
beyond loopback, bodies over the limit a 413, JSON errors in OpenAI's shape.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import secrets
import threading
import time
from pathlib import Path
from typing import Any

from aiohttp import web

from orchestra_jax.rollout.server import access as http_access
from orchestra_jax.rollout.server.access import json_error, read_json_body, require_key
from orchestra_jax.serve.request import BadRequest, parse_request
from orchestra_jax.serve.service import Answer, Orchestrator

log = logging.getLogger(__name__)
ASSETS = Path(__file__).parent / "assets"
PAGE = ASSETS / "index.html"
DEFAULT_API_KEY_ENV = "ORCHESTRA_SERVE_API_KEY"


@dataclasses.dataclass(frozen=True)
class ServeConfig:
    """The server's limits and access."""

    max_body_bytes: int = 2**20  # larger bodies get a 413
    max_concurrent: int = 32  # requests answered at once; one more gets a 429
    api_key: str | None = dataclasses.field(default=None, repr=False)
    assets: Path = ASSETS

    def __post_init__(self):
        if self.max_body_bytes < 1 or self.max_concurrent < 1:
            raise ValueError("max_body_bytes and max_concurrent must be >= 1")


@web.middleware
async def _errors_as_json(request: web.Request, handler):
    try:
        return await handler(request)
    except BadRequest as e:
        return json_error(e.status, str(e), "BadRequestError", e.param)
    except web.HTTPException as e:  # 404/405 from routing, 413 from the body limit
        return json_error(e.status, e.reason or "error", "HTTPError")
    except Exception as e:  # noqa: BLE001 - one request's failure is its own
        log.exception("request to %s failed", request.path)
        return json_error(500, f"{type(e).__name__}: {e}", "InternalError")


def _is_page(request: web.Request) -> bool:
    return request.method == "GET" and (request.path == "/" or request.path.startswith("/assets/"))


def api_key_from(env_name: str, host: str) -> str | None:
    """The key in `$env_name` (None when unset or empty); SystemExit when `host` is
    beyond loopback and there is none."""
    return http_access.api_key_from(
        env_name,
        host,
        exposes="the orchestrator",
        harm="spend on its experts",
        default_env=DEFAULT_API_KEY_ENV,
        flag="--api_key_env",
    )


def _sse(data: Any) -> bytes:
    text = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
    return f"data: {text}\n\n".encode()


class OrchestratorServer:
    """The request handlers around one `Orchestrator`."""

    def __init__(self, orchestrator: Orchestrator, config: ServeConfig | None = None):
        self.orchestrator = orchestrator
        self.config = config or ServeConfig()
        self.in_flight = 0

    def app(self) -> web.Application:
        middlewares = [_errors_as_json]
        if self.config.api_key:
            # The page holds no data; its requests carry the key.
            middlewares.insert(0, require_key(self.config.api_key, open_to=_is_page))
        app = web.Application(middlewares=middlewares, client_max_size=self.config.max_body_bytes)
        app.add_routes(
            [
                web.post("/v1/chat/completions", self.chat_completions),
                web.get("/v1/models", self.models),
                web.get("/v1/orchestrator", self.describe),
                web.get("/health", self.health),
                web.get("/", self.page),
                web.get("/assets/{name}", self.asset),
            ]
        )
        return app

    # -- static ---------------------------------------------------------------------------

    async def page(self, request: web.Request) -> web.StreamResponse:
        path = self.config.assets / "index.html"
        if not path.is_file():
            return json_error(
                404,
                f"the web page is not installed: {path} is missing (the API at "
                "/v1/chat/completions works without it)",
                "NotFound",
            )
        return web.FileResponse(path, headers={"Cache-Control": "no-cache"})

    async def asset(self, request: web.Request) -> web.StreamResponse:
        name = request.match_info["name"]
        root = self.config.assets.resolve()
        path = (root / name).resolve()
        if path.parent != root or not path.is_file():
            return json_error(404, f"no asset {name!r}", "NotFound")
        return web.FileResponse(path, headers={"Cache-Control": "no-cache"})

    # -- information ----------------------------------------------------------------------

    async def models(self, request: web.Request) -> web.Response:
        card = {"id": self.orchestrator.name, "object": "model", "owned_by": "orchestra_jax"}
        return web.json_response({"object": "list", "data": [card]})

    async def describe(self, request: web.Request) -> web.Response:
        body = self.orchestrator.describe()
        body["limits"] = {
            "max_concurrent": self.config.max_concurrent,
            "max_body_bytes": self.config.max_body_bytes,
            "max_turns": self.orchestrator.defaults.max_turns,
        }
        return web.json_response(body)

    async def health(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok", "in_flight": self.in_flight})

    # -- chat completions -----------------------------------------------------------------

    async def _body(self, request: web.Request) -> Any:
        return await read_json_body(
            request,
            max_body_bytes=self.config.max_body_bytes,
            flag="--max_body_bytes",
            refuse=BadRequest,
        )

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        if self.in_flight >= self.config.max_concurrent:
            return json_error(
                429,
                f"{self.in_flight} requests in flight, this server's limit "
                f"(--max_concurrent={self.config.max_concurrent}); retry later",
                "RateLimitError",
                **{"Retry-After": "1"},
            )
        self.in_flight += 1  # counted from here: the body is read under the limit too
        try:
            parsed = parse_request(await self._body(request), self.orchestrator.defaults)
            prepared = self.orchestrator.prepare(parsed)
            head = {
                "id": f"chatcmpl-{secrets.token_hex(12)}",
                "created": int(time.time()),
                "model": self.orchestrator.name,
            }
            if parsed.stream:
                return await self._stream(request, prepared, head)
            answer = await self.orchestrator.run(prepared)
            return web.json_response(
                {
                    **head,
                    "object": "chat.completion",
                    "choices": [
                        {
                            "index": 0,
                            "finish_reason": answer.finish_reason,
                            "message": {"role": "assistant", "content": answer.content},
                        }
                    ],
                    "usage": answer.usage,
                    "orchestration": answer.orchestration,
                }
            )
        finally:
            self.in_flight -= 1

    async def _stream(self, request: web.Request, prepared, head) -> web.StreamResponse:
        steps: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        work = asyncio.ensure_future(self.orchestrator.run(prepared, steps.put_nowait))
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )

        def chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> bytes:
            choice = {"index": 0, "delta": delta, "finish_reason": finish}
            return _sse({**head, "object": "chat.completion.chunk", "choices": [choice], **extra})

        getter: asyncio.Future | None = None
        try:
            await response.prepare(request)
            await response.write(chunk({"role": "assistant", "content": ""}))
            while True:
                getter = asyncio.ensure_future(steps.get())
                done, _ = await asyncio.wait({getter, work}, return_when=asyncio.FIRST_COMPLETED)
                if getter not in done:
                    getter.cancel()
                    break
                await response.write(chunk({}, orchestra_step=getter.result()))
            while not steps.empty():
                await response.write(chunk({}, orchestra_step=steps.get_nowait()))
            try:
                answer: Answer = work.result()
            except BadRequest as e:
                await response.write(_sse({"error": {"message": str(e), "code": e.status}}))
            except Exception as e:  # noqa: BLE001 - reported to this client only
                log.exception("streamed request failed")
                await response.write(
                    _sse({"error": {"message": f"{type(e).__name__}: {e}", "code": 500}})
                )
            else:
                await response.write(chunk({"content": answer.content}))
                await response.write(
                    chunk(
                        {},
                        answer.finish_reason,
                        usage=answer.usage,
                        orchestration=answer.orchestration,
                    )
                )
            await response.write(_sse("[DONE]"))
            await response.write_eof()
            return response
        finally:
            if getter is not None and not getter.done():
                getter.cancel()
            if not work.done():  # the client went away: its orchestration stops
                work.cancel()
                await asyncio.gather(work, return_exceptions=True)


async def start(server: OrchestratorServer, host: str, port: int) -> tuple[web.AppRunner, str]:
    """Starts listening; (the runner to clean up, the base URL)."""
    runner = web.AppRunner(
        server.app(), access_log=None, handler_cancellation=True, shutdown_timeout=2
    )
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    bound = runner.addresses[0][1]
    return runner, f"http://{host}:{bound}"


class ServerThread:
    """An `OrchestratorServer` on its own event loop in a daemon thread (tests,
    benchmarks, notebooks). A context manager; `url` is its base URL."""

    def __init__(self, server: OrchestratorServer, *, host: str = "127.0.0.1", port: int = 0):
        self.server = server
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._runner: web.AppRunner | None = None
        self._error: BaseException | None = None
        self.url = ""
        self._thread = threading.Thread(
            target=self._run, args=(host, port), daemon=True, name="orchestra-serve"
        )
        self._thread.start()
        self._ready.wait()
        if self._error is not None:
            raise RuntimeError(f"orchestrator server failed to start: {self._error}")

    def _run(self, host: str, port: int) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._runner, self.url = self._loop.run_until_complete(start(self.server, host, port))
        except BaseException as e:  # noqa: BLE001 - reported to the starting thread
            self._error = e
            self._ready.set()
            return
        self._ready.set()
        self._loop.run_forever()

    def call(self, coroutine: Any, timeout: float = 60) -> Any:
        """Runs `coroutine` on the server's loop; its result."""
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(timeout)

    def stop(self) -> None:
        if not self._loop.is_running() or self._runner is None:
            return
        self.call(self._runner.cleanup())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=30)

    def __enter__(self) -> ServerThread:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()
