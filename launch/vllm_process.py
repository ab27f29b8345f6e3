"""A vLLM server from Python: launch/vllm_server.sh in a process group of its own,
for benchmarks and tests.

    process, url = serve(folder, log_path, {"DTYPE": "float32", "TOKENIZER": "0"})
    ...
    stop(process)

`serve` passes `settings` to the launcher as environment variables (VLLM_PYTHON,
DTYPE, TOKENIZER, EAGER, LORA_RANK, …: see launch/vllm_server.sh) and returns
once `GET /v1/models` answers (sending ROLLOUT_API_KEY, from `settings` or
the environment, when set), or raises with the log's tail; `stop` ends the
whole group (the API server and its engine). On Linux the server is sent
SIGTERM when the process that started it dies without stopping it (a test
worker killed for memory, a benchmark interrupted), so no orphan server keeps
its gigabytes.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Mapping

from launch.local_hosts import free_port

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
START_TIMEOUT_S = 1800  # ~1 min on 2 quiet cores (eager); much longer when shared


def serve(
    folder: str,
    log_path: str,
    settings: Mapping[str, str],
    *,
    start_timeout_s: float = START_TIMEOUT_S,
) -> tuple[subprocess.Popen, str]:
    """launch/vllm_server.sh on `folder` on loopback; (process, URL) once it answers."""
    port = free_port()
    env = {**os.environ, "HOST": "127.0.0.1", **settings}
    log = open(log_path, "w")  # noqa: SIM115 - the process owns it until it ends
    script = os.path.join(ROOT, "launch", "vllm_server.sh")
    process = subprocess.Popen(
        [sys.executable, "-c", _WITH_PARENT, str(os.getpid()), "bash", script, folder, str(port)],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # stopped as a group: the API server and its engine
    )
    url = f"http://127.0.0.1:{port}"
    key = env.get("ROLLOUT_API_KEY")  # the server then requires it on /v1/*
    ready = urllib.request.Request(
        url + "/v1/models", headers={"Authorization": f"Bearer {key}"} if key else {}
    )
    deadline = time.monotonic() + start_timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(
                f"vLLM exited ({process.returncode}): {open(log_path).read()[-3000:]}"
            )
        try:
            with urllib.request.urlopen(ready, timeout=5):
                return process, url
        except OSError:
            time.sleep(2)
    stop(process)
    raise RuntimeError(
        f"vLLM did not start in {start_timeout_s:.0f} s: {open(log_path).read()[-3000:]}"
    )


# Run first in the child, a fresh interpreter: on Linux, SIGTERM when the parent
# dies (PR_SET_PDEATHSIG, which survives the exec of the launcher and the
# launcher's exec of the server); then exec the rest of argv. Not a preexec_fn:
# Python code between fork and exec in a multithreaded (JAX) process may deadlock.
_WITH_PARENT = """
import ctypes, os, signal, sys
try:
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)
except (OSError, AttributeError):
    pass
if os.getppid() != int(sys.argv[1]):
    sys.exit("the process that started the server has already exited")
os.execvp(sys.argv[2], sys.argv[2:])
"""


def stop(process: subprocess.Popen) -> None:
    """Ends the server's process group (SIGTERM, then SIGKILL after 120 s)."""
    if process.poll() is None:
        os.killpg(process.pid, 15)
        try:
            process.wait(timeout=120)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, 9)
            process.wait(timeout=30)
