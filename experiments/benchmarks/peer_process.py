"""A benchmark peer run in another Python (e.g. a venv with Tunix), one step per request.

    peer = PeerProcess.start(python, "experiments.benchmarks.tunix_peer", ["train", ...])
    if peer.available: seconds = peer.step()   # the peer times its own step
    peer.close()

The worker prints one JSON line when ready ({"ready": true, ...} or
{"ready": false, "reason": ...}), then answers each "step" line on stdin with
{"seconds": s, ...}. The benchmark alternates its own calls with `peer.step()`,
so ours and the peer share the machine's load as in-process peers do; while
the peer waits for a request it uses no CPU.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
from typing import Any

REPO = pathlib.Path(__file__).resolve().parents[2]


PYENV_311 = pathlib.Path.home() / ".pyenv/versions/3.11.7/bin/python"


def hf_python() -> str:
    """The interpreter that runs the HF peer: $HF_PYTHON, else pyenv's 3.11.7 if present,
    else this one."""
    if os.environ.get("HF_PYTHON"):
        return os.environ["HF_PYTHON"]
    return str(PYENV_311) if PYENV_311.exists() else sys.executable


def torch_importable() -> bool:
    """Whether this interpreter has torch (else the HF peer, `hf_peer.py`, runs in `hf_python()`)."""
    import importlib.util

    return importlib.util.find_spec("torch") is not None


def tunix_python() -> str:
    """The interpreter that has Tunix: $TUNIX_PYTHON, else this one."""
    return os.environ.get("TUNIX_PYTHON") or sys.executable


class PeerProcess:
    """One worker process; `available` is False (with `reason`) when it could not start."""

    def __init__(self, proc: subprocess.Popen | None, info: dict[str, Any]):
        self.proc, self.info = proc, info
        self.available = bool(info.get("ready"))
        self.reason = info.get("reason", "")

    @classmethod
    def start(
        cls, python: str, module: str, args: list[str], env: dict[str, str] | None = None
    ) -> PeerProcess:
        """Starts `python -m module *args` with this environment plus `env`."""
        env = dict(os.environ, **(env or {}), PYTHONPATH=str(REPO))
        try:
            proc = subprocess.Popen(
                [python, "-m", module, *args],
                cwd=REPO,
                env=env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
        except OSError as e:
            return cls(None, {"ready": False, "reason": f"cannot start {python}: {e}"})
        line = proc.stdout.readline()
        try:
            info = json.loads(line)
        except json.JSONDecodeError:
            proc.kill()
            return cls(None, {"ready": False, "reason": f"peer exited: {line!r}"})
        peer = cls(proc, info)
        if not peer.available:
            peer.close()
        return peer

    def step(self, request: str = "step") -> float:
        """Runs one step in the peer (`request`: the line sent, for workers that time
        more than one thing); its own timing of it in seconds."""
        self.proc.stdin.write(request + "\n")
        self.proc.stdin.flush()
        reply = json.loads(self.proc.stdout.readline())
        self.last = reply
        return float(reply["seconds"])

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.stdin.close()
            self.proc.wait(timeout=60)


def serve(step_fn, info: dict[str, Any]) -> None:
    """Worker side: announce `info` (ready), then time `step_fn()` per "step" line."""
    import time

    print(json.dumps({"ready": True, **info}), flush=True)
    for line in sys.stdin:
        if line.strip() != "step":
            continue
        start = time.perf_counter()
        extra = step_fn() or {}
        seconds = time.perf_counter() - start
        print(json.dumps({"seconds": seconds, **extra}), flush=True)


def refuse(reason: str) -> None:
    """Worker side: say why this peer cannot run."""
    print(json.dumps({"ready": False, "reason": reason}), flush=True)
