"""Serve any RolloutEngine over SGLang's native HTTP protocol (plus OpenAI chat).

    python -m orchestra_jax.rollout.server --model demo --tokenizer demo --port 30000

Endpoints (the JSON SGLang 0.5.23 speaks, see `rollout/http/sglang_protocol.py`):
  POST /generate                  token-in/token-out (or text with --tokenizer), single or
                                  batched, n samples, logprobs, stop ids and strings, stream
  GET  /health, /health_generate  a one-token generation within --health-timeout: 200 or 503
  GET  /model_info, /get_model_info  model, tokenizer, weight version, parsers
  POST /flush_cache               drops the engine's cached prefixes (400 if it cannot now)
  POST /update_weights_from_disk  {"model_path", "weight_version"?, "abort_all_requests"?}:
                                  waits for (or aborts) the requests in flight, swaps the
                                  weights, flushes the cache
  POST /load_lora_adapter         {"lora_name", "lora_path"}: a PEFT LoRA folder into the
                                  engine's adapters (a model started with --lora-rank)
  POST /unload_lora_adapter       {"lora_name"}
  POST /update_weight_version     {"new_version"}: names the weights now served
  POST /v1/chat/completions       OpenAI chat (needs --tokenizer): Qwen3 tool calls and
                                  reasoning parsed, see `rollout/server/openai_chat.py`
  GET  /v1/models                 the model, with its context as `max_model_len`

Access: the server listens on loopback (--host 127.0.0.1) unless told
otherwise. With an API key (the environment variable --api-key-env names,
ROLLOUT_API_KEY by default; never on the command line) every route, /health
included, answers 401 unless the request carries `Authorization: Bearer
<key>`, which the project's clients send (`rollout/http/client.py`). Without one,
anyone who reaches the port may load weights or adapters from any path this
process can read (/update_weights_from_disk, /load_lora_adapter), so a host
beyond loopback needs a key (`main` refuses to start otherwise).

Every request is checked completely before the engine sees it (`parse_generate`);
a bad one gets a 4xx JSON `{"error": {"message", "type", "code"}}` and nothing
else in flight notices. Bodies above --max-body-bytes get a 413, batches above
--max-batch-prompts a 413, both naming the limit. An engine failure fails only
the requests it belongs to (500); a client that disconnects has its work
cancelled; a request id already in flight is refused (400), as SGLang does.
Every response carries `meta_info.weight_version`, the version that generated all
of its tokens.

LoRA: the engine's model carries one set of adapters (`models/lora.py`), so this
server serves one adapter at a time beside its base, where SGLang serves several
at once. `/load_lora_adapter` swaps the folder's adapter in (as
`/update_weights_from_disk` swaps weights: requests in flight finish first,
the cache is flushed) under the next weight version, and the adapter it
replaces is no longer served: a /generate naming it (`lora_path`) is refused
(400), unloading it only forgets its name. A /generate naming no adapter is
served by the base plus the adapter loaded last (SGLang: the base alone).
`/update_weight_version` relabels the weights served now (the sync protocol
of `rollout/http/sglang_client.py`); its `abort_all_requests` is not honoured: requests in
flight finish, on the weights the relabel leaves as they are. SIGTERM stops admitting, lets requests in flight finish for up to
--drain-timeout seconds, aborts the rest, stops the engine and exits 0.

This is how a TPU slice serves rollouts to a learner elsewhere, and how tests run
the SGLang client without a GPU (`serve_in_thread`).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import logging
import signal
import threading
from collections.abc import Callable
from typing import Any

from aiohttp import web

from orchestra_jax.rollout.engine import (
    Completion,
    GenerateRequest,
    RolloutEngine,
    SamplingParams,
    StreamingEngine,
)
from orchestra_jax.rollout.http import sglang_protocol as proto
from orchestra_jax.rollout.http.sglang_protocol import RequestError
from orchestra_jax.rollout.server import access as http_access
from orchestra_jax.rollout.server.access import json_error, read_json_body, require_key
from orchestra_jax.rollout.server.openai_chat import chat_completion

log = logging.getLogger(__name__)
WeightLoader = Callable[[str], Any]  # HF folder -> model or nnx.State for update_weights
ADAPTER_ENGINE_METHOD = "update_adapter"  # what an engine that serves LoRA adapters has
_UNBOUNDED = 2**31 - 1  # an engine that states no vocabulary or context


@dataclasses.dataclass(frozen=True)
class ServerConfig:
    """What the server reports and the limits it enforces."""

    model_path: str = "model"  # reported by /model_info and as the OpenAI model id
    tokenizer_path: str | None = None
    max_body_bytes: int = 64 * 2**20  # larger bodies get a 413
    max_batch_prompts: int = 1024  # prompts per /generate after n; more get a 413
    health_timeout_s: float = 20.0  # /health fails if one token takes longer (SGLang: 20)
    drain_timeout_s: float = 5.0  # on SIGTERM, how long requests in flight may finish
    # None: taken from a JaxEngine (its model's vocabulary and eos, its max_seq_len).
    vocab_size: int | None = None
    context_len: int | None = None
    eos_token_ids: tuple[int, ...] | None = None
    # Requests must carry `Authorization: Bearer <api_key>` (401 otherwise); None: open.
    api_key: str | None = dataclasses.field(default=None, repr=False)


class ServerClosing(RuntimeError):
    """The server is shutting down: new work gets a 503."""


@web.middleware
async def _errors_as_json(request: web.Request, handler):
    """Turn every failure into a JSON error instead of a dropped connection."""
    try:
        return await handler(request)
    except RequestError as e:
        return json_error(e.status, str(e), "BadRequestError", e.param)
    except web.HTTPException as e:  # 404/405 from routing, 413 from the body limit
        return json_error(e.status, e.reason or "error", "HTTPError")
    except ServerClosing as e:
        return json_error(503, str(e), "ServiceUnavailable")
    except Exception as e:  # noqa: BLE001 - the server must survive engine errors
        log.exception("request to %s failed", request.path)
        return json_error(500, f"{type(e).__name__}: {e}", "InternalError")


def _engine_limits(engine: RolloutEngine, config: ServerConfig, tokenizer) -> proto.ServerLimits:
    """The model's bounds: from the config, else from a JaxEngine, else unbounded."""
    from_engine = getattr(engine, "model_config", None)  # a JaxEngine's Qwen3Config
    vocab = config.vocab_size or getattr(from_engine, "vocab_size", None) or _UNBOUNDED
    context = config.context_len or getattr(engine, "max_seq_len", None) or _UNBOUNDED
    eos = config.eos_token_ids
    if eos is None:
        model_eos = getattr(from_engine, "eos_token_id", None)
        eos = (model_eos,) if isinstance(model_eos, int) else tuple(model_eos or ())
        if tokenizer is not None:
            eos = tuple(sorted({*eos, tokenizer.eos_id}))
    top = getattr(getattr(engine, "config", None), "max_top_logprobs", 20)
    return proto.ServerLimits(
        vocab_size=vocab,
        context_len=context,
        eos_token_ids=tuple(eos),
        max_batch_prompts=config.max_batch_prompts,
        max_top_logprobs=top,
        can_decode=tokenizer is not None,
    )


class RolloutServer:
    """The request handlers around one engine (and optionally a tokenizer)."""

    def __init__(
        self,
        engine: RolloutEngine,
        config: ServerConfig | None = None,
        *,
        tokenizer=None,
        weight_loader: WeightLoader | None = None,
    ):
        self.engine = engine
        self.config = config = config or ServerConfig()
        self.tokenizer = tokenizer
        self.weight_loader = weight_loader
        self.limits = _engine_limits(engine, config, tokenizer)
        version = getattr(engine, "weight_version", 0)
        self._version = int(version) if isinstance(version, int) else 0
        self._version_names = {self._version: str(self._version)}
        self._update_lock = asyncio.Lock()
        # LoRA adapters loaded by name, oldest first: the last is the one served, the
        # others were replaced by it (forgotten on unload).
        self._adapters: list[str] = []
        self._rids_in_flight: set[str] = set()
        self._in_flight = 0
        self.closing = False

    @property
    def weight_version(self) -> str:
        return self._version_names[self._version]

    def app(self) -> web.Application:
        middlewares = [_errors_as_json]
        if self.config.api_key:
            middlewares.insert(0, require_key(self.config.api_key))
        app = web.Application(middlewares=middlewares, client_max_size=self.config.max_body_bytes)
        app.add_routes(
            [
                web.post("/generate", self.generate),
                web.put("/generate", self.generate),
                web.get("/health", self.health),
                web.get("/health_generate", self.health),
                web.get("/get_model_info", self.model_info),
                web.get("/model_info", self.model_info),
                web.post("/flush_cache", self.flush_cache),
                web.get("/flush_cache", self.flush_cache),
                web.post("/update_weights_from_disk", self.update_weights_from_disk),
                web.post("/load_lora_adapter", self.load_lora_adapter),
                web.post("/unload_lora_adapter", self.unload_lora_adapter),
                web.post("/update_weight_version", self.update_weight_version),
                web.post("/v1/chat/completions", self.chat_completions),
                web.get("/v1/models", self.models),
            ]
        )
        return app

    # -- plumbing -------------------------------------------------------------------------

    async def _json_body(self, request: web.Request) -> Any:
        return await read_json_body(
            request,
            max_body_bytes=self.config.max_body_bytes,
            flag="--max-body-bytes",
            refuse=RequestError,
        )

    def _admit(self, rids: list[str]) -> None:
        if self.closing:
            raise ServerClosing("the server is shutting down")
        for rid in rids:
            if rid in self._rids_in_flight:
                raise RequestError(f"Duplicate request ID detected: {rid}")
        self._rids_in_flight.update(rids)
        self._in_flight += 1

    def _release(self, rids: list[str]) -> None:
        self._rids_in_flight.difference_update(rids)
        self._in_flight -= 1

    async def _run(self, requests: list[GenerateRequest]) -> list[Completion]:
        """engine.generate: its ValueError (a request it refuses, nothing queued) is a 400,
        a closed engine a 503."""
        try:
            return await self.engine.generate(requests)
        except ValueError as e:
            raise RequestError(str(e)) from None
        except RuntimeError as e:
            if self.closing:
                raise ServerClosing(f"the server is shutting down ({e})") from None
            raise

    def _decode(self, ids, *, skip_special_tokens: bool = False) -> str:
        assert self.tokenizer is not None  # only called where the server has one
        return self.tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)

    def _version_name(self, completion: Completion) -> str:
        if completion.weight_version is None:
            return self.weight_version
        return self._version_names.get(completion.weight_version, self.weight_version)

    def _response(self, call: proto.GenerateCall, item: proto.WireItem, c: Completion) -> dict:
        text = None
        if self.tokenizer is not None:
            text = proto.output_text(
                c,
                self._decode,
                skip_special_tokens=item.skip_special_tokens,
                no_stop_trim=item.no_stop_trim,
            )
        tokenizer = self.tokenizer
        token_text = (
            (lambda t: tokenizer.decode([t]))
            if call.return_text_in_logprobs and tokenizer is not None
            else (lambda _: None)
        )
        return proto.response_json(
            item,
            c,
            text=text,
            weight_version=self._version_name(c),
            token_text=token_text,
            prompt_token_ids=call.return_prompt_token_ids,
        )

    # -- endpoints ------------------------------------------------------------------------

    async def generate(self, request: web.Request) -> web.StreamResponse:
        body = await self._json_body(request)
        encode = self.tokenizer.encode if self.tokenizer is not None else None
        call = proto.parse_generate(body, self.limits, encode, self._adapters[-1:])
        rids = [item.rid for item in call.items]
        self._admit(rids)
        try:
            if call.stream:
                return await self._stream(request, call)
            completions = await self._run([item.request for item in call.items])
            out = [self._response(call, i, c) for i, c in zip(call.items, completions)]
            return web.json_response(out if call.batched else out[0])
        finally:
            self._release(rids)

    async def _stream(self, request: web.Request, call: proto.GenerateCall) -> web.StreamResponse:
        """Server-sent events: cumulative outputs as they grow (with "index" when batched),
        then `data: [DONE]`. A request the engine refuses before its first token gets a
        plain 400; a failure after the stream started is sent as an error event."""
        updates: asyncio.Queue = asyncio.Queue()

        async def one(index: int, item: proto.WireItem):
            if isinstance(self.engine, StreamingEngine):
                async for c in self.engine.stream(item.request):
                    updates.put_nowait((index, item, c))
            else:
                [c] = await self._run([item.request])
                updates.put_nowait((index, item, c))

        tasks = [asyncio.ensure_future(one(i, item)) for i, item in enumerate(call.items)]
        waiter = asyncio.gather(*tasks)
        response = None
        try:
            while True:
                getter = asyncio.ensure_future(updates.get())
                await asyncio.wait({getter, waiter}, return_when=asyncio.FIRST_COMPLETED)
                if not getter.done():
                    getter.cancel()
                    error = waiter.exception() if response is None else None
                    if error is not None:
                        raise error
                    response = response or await self._start_stream(request)
                    while not updates.empty():
                        await self._send_update(response, call, *updates.get_nowait())
                    waiter.result()  # raises the first failure
                    break
                response = response or await self._start_stream(request)
                await self._send_update(response, call, *getter.result())
        except ValueError as e:
            if response is None:
                raise RequestError(str(e)) from None
            await self._sendjson_error(response, e)
        except RuntimeError as e:
            if response is None:
                raise
            await self._sendjson_error(response, e)
        finally:
            for task in tasks:
                task.cancel()
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    async def _start_stream(self, request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        return response

    async def _sendjson_error(self, response: web.StreamResponse, error: Exception) -> None:
        body = {"error": {"message": str(error), "type": type(error).__name__, "code": 400}}
        await response.write(b"data: " + json.dumps(body).encode() + b"\n\n")

    async def _send_update(self, response, call, index, item, completion) -> None:
        out = self._response(call, item, completion)
        if call.batched:
            out["index"] = index
        await response.write(b"data: " + json.dumps(out).encode() + b"\n\n")

    async def health(self, request: web.Request) -> web.Response:
        """200 if one greedy token comes back within the timeout (503 while closing)."""
        if self.closing:
            return web.Response(status=503)
        probe = GenerateRequest([0], SamplingParams(temperature=0.0, max_new_tokens=1))
        try:
            [c] = await asyncio.wait_for(
                self.engine.generate([probe]), timeout=self.config.health_timeout_s
            )
        except Exception:  # noqa: BLE001 - any failure is "unhealthy"
            log.exception("health check generation failed")
            return web.Response(status=503)
        return web.Response(status=200 if len(c.output_ids) == 1 else 503)

    async def model_info(self, request: web.Request) -> web.Response:
        parsers = self.tokenizer is not None
        return web.json_response(
            {
                "model_path": self.config.model_path,
                "served_model_name": self.config.model_path,
                "tokenizer_path": self.config.tokenizer_path,
                "is_generation": True,
                "preferred_sampling_params": None,
                "weight_version": self.weight_version,
                "load_format": "auto",
                "reasoning_parser": "qwen3" if parsers else None,
                "tool_call_parser": "qwen25" if parsers else None,
                "disaggregation_mode": "null",
                "has_image_understanding": False,
                "has_audio_understanding": False,
                "model_type": "qwen3",
                "architectures": ["Qwen3ForCausalLM"],
            }
        )

    async def flush_cache(self, request: web.Request) -> web.Response:
        if await self.engine.flush_cache():
            return web.Response(text="Cache flushed.\n")
        return web.Response(
            status=400, text="Cache not flushed: requests are running; retry when idle.\n"
        )

    async def update_weights_from_disk(self, request: web.Request) -> web.Response:
        body = await self._json_body(request)
        if not isinstance(body, dict):
            raise RequestError("body must be a JSON object with model_path")
        path = body.get("model_path")
        if not isinstance(path, str) or not path:
            raise RequestError("model_path (a folder with HF safetensors) is required")
        name = body.get("weight_version")
        if name is not None and not isinstance(name, str):
            raise RequestError(f"weight_version must be a string, got {name!r}")
        abort = body.get("abort_all_requests", False)
        if not isinstance(abort, bool):
            raise RequestError(f"abort_all_requests must be a boolean, got {abort!r}")
        if self.weight_loader is None:
            return web.json_response(
                {"success": False, "message": "this server was started without a weight loader"},
                status=400,
            )
        async with self._update_lock:
            try:
                state = await asyncio.to_thread(self.weight_loader, path)
            except (OSError, ValueError, KeyError) as e:
                return web.json_response(
                    {"success": False, "message": f"could not load weights from {path}: {e}"},
                    status=400,
                )
            # The engine's version: the name itself when it is an integer (the learner's
            # step, as SGLangClient sends it), else the next free number.
            version = max(self._version_names) + 1
            if name is not None and name.strip().lstrip("-").isdigit():
                version = int(name)
            # Waits for the requests in flight (or aborts them), then flushes the cache.
            await self.engine.update_weights(state, version=version, abort_in_flight=abort)
            self._version_names[version] = name if name is not None else str(version)
            self._version = version
        return web.json_response(
            {
                "success": True,
                "num_paused_requests": 0,
                "message": f"loaded {path} as weight version {self.weight_version}",
            }
        )

    def _lora_result(self, success: bool, message: str | None = None) -> web.Response:
        """SGLang's LoRAUpdateOutput: 200 on success, else 400."""
        body = {
            "success": success,
            "error_message": message,
            "loaded_adapters": dict.fromkeys(self._adapters[-1:], "loaded"),
        }
        return web.json_response(body, status=200 if success else 400)

    async def load_lora_adapter(self, request: web.Request) -> web.Response:
        body = await self._json_body(request)
        if not isinstance(body, dict):
            raise RequestError("body must be a JSON object with lora_name and lora_path")
        name, path = body.get("lora_name"), body.get("lora_path")
        if not isinstance(name, str) or not name or not isinstance(path, str) or not path:
            raise RequestError("lora_name and lora_path (a PEFT adapter folder) are required")
        update = getattr(self.engine, ADAPTER_ENGINE_METHOD, None)
        if update is None:
            return self._lora_result(False, "this server's engine does not serve LoRA adapters")
        async with self._update_lock:
            version = max(self._version_names) + 1
            try:
                await update(path, version=version)
            except (OSError, ValueError, KeyError) as e:
                return self._lora_result(False, f"could not load adapter {name} from {path}: {e}")
            self._version_names[version] = str(version)
            self._version = version
            if name in self._adapters:
                self._adapters.remove(name)
            self._adapters.append(name)
        return self._lora_result(True)

    async def unload_lora_adapter(self, request: web.Request) -> web.Response:
        body = await self._json_body(request)
        name = body.get("lora_name") if isinstance(body, dict) else None
        if not isinstance(name, str) or not name:
            raise RequestError("lora_name is required")
        if name not in self._adapters:
            return self._lora_result(False, f"LoRA adapter {name!r} is not loaded")
        if name == self._adapters[-1]:
            return self._lora_result(
                False,
                f"LoRA adapter {name!r} is the one this server serves (it holds one at a "
                "time): load another to replace it",
            )
        self._adapters.remove(name)  # replaced already: nothing left to free
        return self._lora_result(True)

    async def update_weight_version(self, request: web.Request) -> web.Response:
        body = await self._json_body(request)
        new = body.get("new_version") if isinstance(body, dict) else None
        if not isinstance(new, str) or not new:
            raise RequestError("new_version (a string) is required")
        async with self._update_lock:
            self._version_names[self._version] = new
        return web.json_response(
            {"success": True, "message": f"Weight version updated to {new}", "new_version": new}
        )

    async def chat_completions(self, request: web.Request) -> web.Response:
        if self.tokenizer is None:
            raise RequestError("/v1/chat/completions needs a server started with --tokenizer")
        body = await self._json_body(request)
        self._admit([])
        try:
            reply = await chat_completion(
                self.engine,
                self.tokenizer,
                body,
                model_name=self.config.model_path,
                limits=self.limits,
            )
        except ValueError as e:
            if isinstance(e, RequestError):
                raise
            raise RequestError(str(e)) from None
        finally:
            self._release([])
        return web.json_response(reply)

    async def models(self, request: web.Request) -> web.Response:
        card: dict[str, Any] = {
            "id": self.config.model_path,
            "object": "model",
            "owned_by": "orchestra_jax",
        }
        if self.limits.context_len < _UNBOUNDED:
            card["max_model_len"] = self.limits.context_len
        return web.json_response({"object": "list", "data": [card]})

    # -- shutdown -------------------------------------------------------------------------

    async def drain(self, timeout_s: float) -> None:
        """Stop admitting; wait up to `timeout_s` for the requests in flight."""
        self.closing = True
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while self._in_flight and loop.time() < deadline:
            await asyncio.sleep(0.05)


class ServerThread:
    """A RolloutServer running on its own event loop in a daemon thread.

    Use as a context manager; `url` is "http://host:port".  `stop()` shuts the
    listener down (clients then see connection errors, like a killed server).
    """

    def __init__(self, server: RolloutServer, *, host: str = "127.0.0.1", port: int = 0):
        self.server = server
        self._host, self._port = host, port
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._runner: web.AppRunner | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, daemon=True, name="rollout-server")
        self._thread.start()
        self._ready.wait()
        if self._error is not None:
            raise RuntimeError(f"rollout server failed to start: {self._error}") from self._error

    def _run(self):
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_until_complete(self._start())
        except BaseException as e:  # noqa: BLE001 - reported to the starting thread
            self._error = e
            self._ready.set()
            return
        self._ready.set()
        self._loop.run_forever()

    async def _start(self):
        self._runner = web.AppRunner(
            self.server.app(), access_log=None, handler_cancellation=True, shutdown_timeout=5
        )
        await self._runner.setup()
        site = web.TCPSite(self._runner, self._host, self._port)
        await site.start()
        self.port = self._runner.addresses[0][1]  # the real port when asked for port 0
        self.url = f"http://{self._host}:{self.port}"

    def stop(self, *, abrupt: bool = False):
        """Shut down; in-flight requests finish first unless `abrupt` (like a killed process)."""
        if not self._loop.is_running():
            return

        async def shutdown():
            runner = self._runner
            assert runner is not None  # set before the loop runs
            if abrupt and runner.server is not None:  # drop open connections, as a crash would
                for handler in list(runner.server.connections):
                    handler.force_close()
                    if handler.transport is not None:
                        handler.transport.abort()
            await runner.cleanup()

        asyncio.run_coroutine_threadsafe(shutdown(), self._loop).result(timeout=60)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=30)

    def __enter__(self) -> ServerThread:
        return self

    def __exit__(self, *exc):
        self.stop()


def serve_in_thread(
    engine: RolloutEngine,
    config: ServerConfig | None = None,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    tokenizer=None,
    weight_loader: WeightLoader | None = None,
) -> ServerThread:
    """Start a rollout server for `engine` on a free port (port=0); for tests and notebooks."""
    server = RolloutServer(engine, config, tokenizer=tokenizer, weight_loader=weight_loader)
    return ServerThread(server, host=host, port=port)


def load_model(name_or_path: str, *, seed: int = 0, like=None, lora=None):
    """A Qwen3 model from an HF folder (local or `gs://`), or a preset name with random
    weights (seeded); with `lora` (a LoRASpec), carrying fresh adapters (B = 0).

    `like` (a Qwen3Config) makes a loaded checkpoint use the same runtime settings
    (dtypes, scan_layers, adapters), so its state fits an engine built from that config.
    """
    from flax import nnx

    from orchestra_jax.io import paths
    from orchestra_jax.models.qwen3.model import Qwen3Config, Qwen3ForCausalLM

    if paths.as_path(name_or_path).is_dir():
        from orchestra_jax.models.hf_checkpoint import load_hf_checkpoint

        # Parameter dtype and layer layout decide the state's tree; match the engine's.
        runtime = (
            {"lora": lora}
            if like is None
            else {"dtype": like.param_dtype, "scan_layers": like.scan_layers, "lora": like.lora}
        )
        model, _ = load_hf_checkpoint(name_or_path, seed=seed, **runtime)
        return model
    return Qwen3ForCausalLM(Qwen3Config.preset(name_or_path, lora=lora), rngs=nnx.Rngs(seed))


def _build_from_args(args) -> RolloutServer:
    # Imported here so the HTTP layer loads without JAX or the model code.
    from orchestra_jax.rollout.jax.engine import JaxEngine, JaxEngineConfig

    tokenizer = None
    if args.tokenizer:
        from orchestra_jax.chat.tokenizer import load_tokenizer

        tokenizer = load_tokenizer(args.tokenizer)
    lora = None
    if args.lora_rank:
        from orchestra_jax.models.lora import LoRASpec

        targets = tuple(t for t in args.lora_targets.split(",") if t)
        lora = LoRASpec(rank=args.lora_rank, alpha=args.lora_alpha, targets=targets)
    model = load_model(args.model, seed=args.seed, lora=lora)
    engine = JaxEngine(
        model,
        JaxEngineConfig(max_batch_size=args.max_batch_size, max_seq_len=args.max_seq_len),
        tokenizer=tokenizer,
    )

    def weight_loader(path: str):
        from orchestra_jax.io import paths

        if not paths.as_path(path).is_dir():
            raise FileNotFoundError(f"no checkpoint folder at {path}")
        return load_model(path, like=model.config)

    config = ServerConfig(
        model_path=args.model,
        tokenizer_path=args.tokenizer,
        max_body_bytes=args.max_body_bytes,
        max_batch_prompts=args.max_batch_prompts,
        health_timeout_s=args.health_timeout,
        drain_timeout_s=args.drain_timeout,
        api_key=args.api_key,
    )
    return RolloutServer(engine, config, tokenizer=tokenizer, weight_loader=weight_loader)


def api_key_from(env_name: str, host: str) -> str | None:
    """The key in `$env_name` (None when unset or empty); SystemExit when `host` is not
    loopback and there is none (`http_access.api_key_from`)."""
    return http_access.api_key_from(
        env_name,
        host,
        exposes="the server",
        harm="load weights from any path",
        default_env="ROLLOUT_API_KEY",
        flag="--api-key-env",
    )


async def serve(server: RolloutServer, host: str, port: int) -> None:
    """Run until SIGTERM or SIGINT, then drain, stop the engine and return."""
    runner = web.AppRunner(server.app(), handler_cancellation=True, shutdown_timeout=2)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    log.info("serving on http://%s:%d", host, port)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    log.info("stopping: draining for up to %.1f s", server.config.drain_timeout_s)
    await server.drain(server.config.drain_timeout_s)
    close = getattr(server.engine, "close", None)
    if close is not None:  # what is still in flight fails (503), the worker stops
        await asyncio.to_thread(close)
    await runner.cleanup()
    log.info("stopped")


def main(argv=None):
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument(
        "--model",
        required=True,
        help="HF folder (config.json + safetensors) or a Qwen3Config preset name (random weights)",
    )
    parser.add_argument("--tokenizer", default=None, help='"demo" or a folder with tokenizer.json')
    parser.add_argument("--host", default="127.0.0.1", help="another than loopback needs a key")
    parser.add_argument(
        "--api-key-env",
        default="ROLLOUT_API_KEY",
        help="the environment variable holding the API key every request must carry "
        "(unset or empty: none)",
    )
    parser.add_argument("--port", type=int, default=30000)
    parser.add_argument("--max-batch-size", type=int, default=16, help="engine slots")
    parser.add_argument("--max-seq-len", type=int, default=2048, help="context length")
    parser.add_argument("--max-body-bytes", type=int, default=ServerConfig.max_body_bytes)
    parser.add_argument("--max-batch-prompts", type=int, default=ServerConfig.max_batch_prompts)
    parser.add_argument("--health-timeout", type=float, default=ServerConfig.health_timeout_s)
    parser.add_argument("--drain-timeout", type=float, default=ServerConfig.drain_timeout_s)
    parser.add_argument("--seed", type=int, default=0, help="init seed for preset models")
    parser.add_argument(
        "--lora-rank",
        type=int,
        default=0,
        help="serve LoRA adapters of this rank beside the base (/load_lora_adapter); 0: none",
    )
    parser.add_argument("--lora-alpha", type=float, default=16.0, help="the adapters' lora_alpha")
    parser.add_argument(
        "--lora-targets",
        default="q,k,v,o,gate,up,down",
        help="the adapted projections, comma-separated (the learner's lora.targets)",
    )
    args = parser.parse_args(argv)
    args.api_key = api_key_from(args.api_key_env, args.host)
    logging.basicConfig(level=logging.INFO)
    asyncio.run(serve(_build_from_args(args), args.host, args.port))


if __name__ == "__main__":
    main()
