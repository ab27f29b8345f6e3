"""launch/vllm_process.py without vLLM: the server's command ends with the process
that started it, even when that process dies without stopping it."""

import os
import signal
import subprocess
import sys
import time

import pytest

from launch import vllm_process

# A parent that starts `sleep` as the launcher starts the server, prints its pid,
# and waits to be killed.
PARENT = """
import os, subprocess, sys, time
from launch import vllm_process
child = subprocess.Popen(
    [sys.executable, "-c", vllm_process._WITH_PARENT, str(os.getpid()), "sleep", "600"],
    start_new_session=True,
)
print(child.pid, flush=True)
time.sleep(600)
"""


def _state(pid: int) -> str:
    """The process's state letter, or "gone"."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return "gone"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_the_server_command_ends_when_its_parent_is_killed():
    root = os.path.dirname(os.path.dirname(os.path.abspath(vllm_process.__file__)))
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": root},
    )
    child = int(parent.stdout.readline())
    time.sleep(0.5)  # past the exec: the child is `sleep` now
    assert _state(child) in "RS"
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    deadline = time.monotonic() + 10
    while _state(child) in "RS" and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _state(child) in ("Z", "gone")  # ended (a zombie until init reaps it)
