"""Serve any RolloutEngine over SGLang's native HTTP protocol (plus OpenAI chat).

    python -m orchestra_jax.rollout.server --model demo --tokenizer demo --port 30000

Endpoints (same JSON as SGLang, see `sglang_protocol.py`):
  POST /generate                  token-in/token-out, single or batched input_ids
  GET  /health, /health_generate  liveness; the second runs a one-token generation
  GET  /get_model_info            {"model_path", "tokenizer_path", "is_generation", "weight_version"}
  POST /flush_cache               no prefix cache here, so nothing to drop; always succeeds
  POST /update_weights_from_disk  {"model_path", "weight_version"?}: load HF weights, swap them in
  POST /v1/chat/completions       OpenAI chat (needs --tokenizer), with `usage` token counts
  GET  /v1/models

Bad requests get a 4xx JSON `{"error": {"message", "type"}}`; engine failures get a
500 with the message. Nothing a client sends can stop the server.  This is how a
TPU slice serves rollouts to a learner elsewhere, and how tests run the SGLang
client without a GPU (`serve_in_thread`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import threading
from typing import Any, Callable

from aiohttp import web

from orchestra_jax.rollout import sglang_protocol as proto
from orchestra_jax.rollout.openai_chat import chat_completion
from orchestra_jax.rollout.engine import GenerateRequest, RolloutEngine, SamplingParams

log = logging.getLogger(__name__)
WeightLoader = Callable[[str], Any]  # HF folder -> model or nnx.State for update_weights


class BadRequest(ValueError):
    """A client error; becomes a 400."""


def _error(status: int, message: str, kind: str) -> web.Response:
    return web.json_response(
        {"error": {"message": message, "type": kind, "code": status}}, status=status
    )


@web.middleware
async def _errors_as_json(request: web.Request, handler):
    """Turn every failure into a JSON error instead of a dropped connection."""
    try:
        return await handler(request)
    except web.HTTPException as e:  # 404/405 from routing
        return _error(e.status, e.reason or "error", "HTTPError")
    except (BadRequest, ValueError) as e:
        return _error(400, str(e), "BadRequest")
    except Exception as e:  # noqa: BLE001 - the server must survive engine errors
        log.exception("request to %s failed", request.path)
        return _error(500, f"{type(e).__name__}: {e}", "InternalError")


async def _json_body(request: web.Request) -> Any:
    try:
        return await request.json()
    except json.JSONDecodeError as e:
        raise BadRequest(f"body is not valid JSON: {e}") from None


class RolloutServer:
    """The request handlers around one engine (and optionally a tokenizer)."""

    def __init__(
        self,
        engine: RolloutEngine,
        *,
        model_path: str = "model",
        tokenizer=None,
        tokenizer_path: str | None = None,
        weight_loader: WeightLoader | None = None,
        weight_version: int = 0,
    ):
        self.engine = engine
        self.model_path = model_path
        self.tokenizer = tokenizer
        self.tokenizer_path = tokenizer_path
        self.weight_loader = weight_loader
        self.weight_version = weight_version

    def app(self) -> web.Application:
        app = web.Application(middlewares=[_errors_as_json], client_max_size=256 * 2**20)
        app.add_routes(
            [
                web.post("/generate", self.generate),
                web.get("/health", self.health),
                web.get("/health_generate", self.health_generate),
                web.get("/get_model_info", self.model_info),
                web.post("/flush_cache", self.flush_cache),
                web.get("/flush_cache", self.flush_cache),
                web.post("/update_weights_from_disk", self.update_weights_from_disk),
                web.post("/v1/chat/completions", self.chat_completions),
                web.get("/v1/models", self.models),
            ]
        )
        return app

    def _text(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids) if self.tokenizer is not None else ""

    async def generate(self, request: web.Request) -> web.Response:
        body = await _json_body(request)
        if isinstance(body, dict) and "input_ids" not in body and "text" in body:
            if self.tokenizer is None:
                raise BadRequest("text prompts need a server started with --tokenizer")
            text = body["text"]
            texts = text if isinstance(text, list) else [text]
            if not all(isinstance(t, str) and t for t in texts):
                raise BadRequest("text must be a non-empty string or list of strings")
            ids = [self.tokenizer.encode(t) for t in texts]
            body = {**body, "input_ids": ids if isinstance(text, list) else ids[0]}
        requests, batched, return_logprob = proto.parse_generate_payload(body)
        completions = await self.engine.generate(requests)
        out = [
            proto.completion_to_json(
                c, rid=r.request_id, text=self._text(c.output_ids), return_logprob=return_logprob
            )
            for r, c in zip(requests, completions)
        ]
        return web.json_response(out if batched else out[0])

    async def health(self, request: web.Request) -> web.Response:
        ok = await self.engine.health()
        return web.Response(status=200 if ok else 503)

    async def health_generate(self, request: web.Request) -> web.Response:
        [completion] = await self.engine.generate(
            [GenerateRequest([0], SamplingParams(temperature=0.0, max_new_tokens=1))]
        )
        return web.Response(status=200 if completion.output_ids else 503)

    async def model_info(self, request: web.Request) -> web.Response:
        return web.json_response(
            {
                "model_path": self.model_path,
                "tokenizer_path": self.tokenizer_path,
                "is_generation": True,
                "weight_version": str(self.weight_version),
            }
        )

    async def flush_cache(self, request: web.Request) -> web.Response:
        flush = getattr(self.engine, "flush_cache", None)
        if flush is not None:
            await flush()
        return web.Response(text="Cache flushed.\n")

    async def update_weights_from_disk(self, request: web.Request) -> web.Response:
        body = await _json_body(request)
        path = body.get("model_path") if isinstance(body, dict) else None
        if not isinstance(path, str) or not path:
            raise BadRequest("model_path (a folder with HF safetensors) is required")
        if self.weight_loader is None:
            return web.json_response(
                {"success": False, "message": "this server was started without a weight loader"},
                status=400,
            )
        version = body.get("weight_version")
        try:
            version = self.weight_version + 1 if version is None else int(version)
        except (TypeError, ValueError):
            raise BadRequest(f"weight_version must be an integer, got {version!r}") from None
        try:
            state = await asyncio.to_thread(self.weight_loader, path)
        except (OSError, ValueError, KeyError) as e:
            return web.json_response(
                {"success": False, "message": f"could not load weights from {path}: {e}"},
                status=400,
            )
        await self.engine.update_weights(state, version=version)
        self.weight_version = version
        return web.json_response(
            {
                "success": True,
                "num_paused_requests": 0,
                "message": f"loaded {path} as weight version {version}",
            }
        )

    async def chat_completions(self, request: web.Request) -> web.Response:
        if self.tokenizer is None:
            raise BadRequest("/v1/chat/completions needs a server started with --tokenizer")
        body = await _json_body(request)
        return web.json_response(
            await chat_completion(self.engine, self.tokenizer, body, model_name=self.model_path)
        )

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response(
            {
                "object": "list",
                "data": [{"id": self.model_path, "object": "model", "owned_by": "orchestra_jax"}],
            }
        )


class ServerThread:
    """A RolloutServer running on its own event loop in a daemon thread.

    Use as a context manager; `url` is "http://host:port".  `stop()` shuts the
    listener down (clients then see connection errors, like a killed server).
    """

    def __init__(self, server: RolloutServer, *, host: str = "127.0.0.1", port: int = 0):
        self._server, self._host, self._port = server, host, port
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
        self._runner = web.AppRunner(self._server.app(), access_log=None)
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
            if abrupt:  # drop open connections mid-request, as a crash would
                for handler in list(self._runner.server.connections):
                    handler.force_close()
                    if handler.transport is not None:
                        handler.transport.abort()
            await self._runner.cleanup()

        asyncio.run_coroutine_threadsafe(shutdown(), self._loop).result(timeout=60)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=30)

    def __enter__(self) -> "ServerThread":
        return self

    def __exit__(self, *exc):
        self.stop()


def serve_in_thread(
    engine: RolloutEngine, *, host: str = "127.0.0.1", port: int = 0, **server_kwargs
) -> ServerThread:
    """Start a rollout server for `engine` on a free port (port=0); for tests and notebooks."""
    return ServerThread(RolloutServer(engine, **server_kwargs), host=host, port=port)


def load_model(name_or_path: str, *, seed: int = 0, like=None):
    """A Qwen3 model from an HF folder, or a preset name with random weights (seeded).

    `like` (a Qwen3Config) makes a loaded checkpoint use the same runtime settings
    (dtypes, scan_layers), so its state fits an engine built from that config.
    """
    import pathlib

    from flax import nnx

    from orchestra_jax.models.qwen3 import Qwen3Config, Qwen3ForCausalLM

    if pathlib.Path(name_or_path).is_dir():
        from orchestra_jax.models.hf_checkpoint import load_hf_checkpoint

        # Parameter dtype and layer layout decide the state's tree; match the engine's.
        runtime = (
            {} if like is None else {"dtype": like.param_dtype, "scan_layers": like.scan_layers}
        )
        model, _ = load_hf_checkpoint(name_or_path, **runtime)
        return model
    return Qwen3ForCausalLM(Qwen3Config.preset(name_or_path), rngs=nnx.Rngs(seed))


def _build_from_args(args) -> RolloutServer:
    # Imported here so the HTTP layer loads without JAX or the model code.
    from orchestra_jax.rollout.jax_engine import JaxEngine

    model = load_model(args.model, seed=args.seed)
    engine = JaxEngine(model, max_batch_size=args.max_batch_size, max_seq_len=args.max_seq_len)
    tokenizer = None
    if args.tokenizer:
        from orchestra_jax.chat.tokenizer import load_tokenizer

        tokenizer = load_tokenizer(args.tokenizer)

    def weight_loader(path: str):
        if not os.path.isdir(path):
            raise FileNotFoundError(f"no checkpoint folder at {path}")
        return load_model(path, like=model.config)

    return RolloutServer(
        engine,
        model_path=args.model,
        tokenizer=tokenizer,
        tokenizer_path=args.tokenizer,
        weight_loader=weight_loader,
    )


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--model",
        required=True,
        help="HF folder (config.json + safetensors) or a Qwen3Config preset name (random weights)",
    )
    parser.add_argument("--tokenizer", default=None, help='"demo" or a folder with tokenizer.json')
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=30000)
    parser.add_argument("--max-batch-size", type=int, default=16)
    parser.add_argument("--max-seq-len", type=int, default=2048)
    parser.add_argument("--seed", type=int, default=0, help="init seed for preset models")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO)
    web.run_app(_build_from_args(args).app(), host=args.host, port=args.port)


if __name__ == "__main__":
    main()
