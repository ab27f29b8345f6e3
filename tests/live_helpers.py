"""Test helpers for live endpoints: a recording HTTP proxy, a free port, server processes.

`RecordingProxy(target)` forwards every request to `target` and keeps
(method, path, request JSON, status, response JSON) for each, so a test can
prove what went over HTTP without touching the server it fronts.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import pathlib
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator, Mapping, Sequence

import aiohttp
from aiohttp import web

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RecordingProxy:
    """An HTTP proxy on 127.0.0.1 (its own thread and event loop) that records traffic."""

    def __init__(self, target: str):
        self.target = target.rstrip("/")
        self.records: list[dict] = []
        self._lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="recording-proxy")
        self._thread.start()
        self._ready.wait(30)
        self.url = f"http://127.0.0.1:{self.port}"

    def _run(self):
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(self._start())
        self._ready.set()
        self._loop.run_forever()

    async def _start(self):
        app = web.Application(client_max_size=64 * 2**20)
        app.router.add_route("*", "/{tail:.*}", self._forward)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = self._runner.addresses[0][1]

    async def _forward(self, request: web.Request) -> web.Response:
        body = await request.read()
        try:
            async with aiohttp.ClientSession() as session:
                async with session.request(
                    request.method,
                    self.target + request.path_qs,
                    data=body,
                    headers={
                        "Content-Type": request.headers.get("Content-Type", "application/json")
                    },
                ) as resp:
                    data = await resp.read()
                    status = resp.status
                    content_type = resp.headers.get("Content-Type", "application/json")
        except aiohttp.ClientError as e:  # the target is down: a 500, as a gateway says
            data, status, content_type = (
                json.dumps({"error": str(e)}).encode(),
                500,
                "application/json",
            )
        record = {"method": request.method, "path": request.path, "status": status}
        for key, raw in (("request", body), ("response", data)):
            try:
                record[key] = json.loads(raw) if raw else None
            except ValueError:
                record[key] = raw.decode(errors="replace")
        with self._lock:
            self.records.append(record)
        return web.Response(body=data, status=status, headers={"Content-Type": content_type})

    def chat_records(self) -> list[dict]:
        """The recorded POSTs to a chat-completions path."""
        with self._lock:
            return [r for r in self.records if r["path"].endswith("/chat/completions")]

    def close(self):
        async def stop():
            await self._runner.cleanup()

        asyncio.run_coroutine_threadsafe(stop(), self._loop).result(timeout=30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=30)


def start_server(port: int, *, model: str = "demo", max_seq_len: int = 2048, log_path: str):
    """`python -m orchestra_jax.rollout.server` hosting a random `model` preset with the
    demo tokenizer on 127.0.0.1:`port` (a subprocess, one CPU device)."""
    env = {**os.environ, "XLA_FLAGS": "", "PYTHONPATH": ROOT}
    log = open(log_path, "w")  # noqa: SIM115 - the process owns it until it ends
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "orchestra_jax.rollout.server.app",
            "--model",
            model,
            "--tokenizer",
            "demo",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--max-seq-len",
            str(max_seq_len),
        ],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )


def wait_until_serving(
    url: str,
    process: subprocess.Popen,
    *,
    timeout_s: float = 120.0,
    path: str = "/v1/models",
    log_path: str | os.PathLike | None = None,
) -> None:
    """Polls `<url><path>` until it answers; raises with the tail of `log_path` (the
    server's log) otherwise."""

    def tail() -> str:
        return "" if log_path is None else "\n" + pathlib.Path(log_path).read_text()[-3000:]

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"server exited with {process.returncode}{tail()}")
        try:
            with urllib.request.urlopen(url + path, timeout=5):
                return
        except OSError:
            time.sleep(0.5)
    raise TimeoutError(f"no server at {url} after {timeout_s:.0f} s{tail()}")


def stop_process(process: subprocess.Popen, *, timeout_s: float = 60.0) -> None:
    """SIGTERM, then SIGKILL after `timeout_s`."""
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


@contextlib.contextmanager
def serve_orchestrator(
    config: str,
    policy: str,
    log_path: str | os.PathLike,
    *,
    flags: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    timeout_s: float = 300.0,
) -> Iterator[str]:
    """`python -m orchestra_jax.serve --config=<config> --policy=<policy>` as a user runs
    it, on a free loopback port (a subprocess, one CPU device, environment `env` or
    this process's); yields its URL once /health answers, stopped at exit."""
    port = free_port()
    with open(log_path, "w") as log:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "orchestra_jax.serve",
                f"--config={config}",
                f"--policy={policy}",
                f"--port={port}",
                *flags,
            ],
            cwd=ROOT,
            env={**(os.environ if env is None else env), "XLA_FLAGS": "", "PYTHONPATH": ROOT},
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        url = f"http://127.0.0.1:{port}"
        wait_until_serving(url, process, timeout_s=timeout_s, path="/health", log_path=log_path)
        yield url
    finally:
        stop_process(process)
