r"""Runs one command as N hosts of a multi-host JAX job, all on this machine.

    python -m launch.local_hosts --num_hosts 2 [--devices_per_host 4] -- \
        python -m experiments.grpo_hle --config=experiments/configs/grpo_hle.py:micro

Starts N processes of the command. Process i gets the environment a cluster
would give host i of N (read by `orchestra_jax/parallel/distributed.py`):

    JAX_COORDINATOR_ADDRESS=127.0.0.1:<free port>   process 0 serves it
    JAX_NUM_PROCESSES=N   JAX_PROCESS_ID=i
    JAX_PLATFORMS=cpu     XLA_FLAGS=--xla_force_host_platform_device_count=K

so each is a CPU host with K fake devices, and the hosts talk over JAX's
Gloo CPU collectives. Every line a process prints (stdout and stderr) is
echoed prefixed with `[host i] `. When one process fails, the others are
stopped (SIGTERM, then SIGKILL after a grace period) and the launcher exits
with the failed process's status (128 + signal number when it was killed);
0 once every process has exited 0. Ctrl-C or SIGTERM stops them all.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from typing import IO

GRACE_S = 10.0
DEVICE_COUNT_FLAG = "--xla_force_host_platform_device_count"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def host_env(
    base: Mapping[str, str], *, host: int, num_hosts: int, devices_per_host: int, port: int
) -> dict[str, str]:
    """The environment of host `host`: coordinator, process count and id, K CPU devices.

    Any device-count flag already in `XLA_FLAGS` is replaced; other flags stay.
    """
    flags = re.sub(rf"{DEVICE_COUNT_FLAG}=\S+", "", base.get("XLA_FLAGS", "")).split()
    flags.append(f"{DEVICE_COUNT_FLAG}={devices_per_host}")
    return {
        **base,
        "JAX_COORDINATOR_ADDRESS": f"127.0.0.1:{port}",
        "JAX_NUM_PROCESSES": str(num_hosts),
        "JAX_PROCESS_ID": str(host),
        "JAX_PLATFORMS": "cpu",
        "XLA_FLAGS": " ".join(flags),
        "PYTHONUNBUFFERED": "1",
    }


def exit_status(returncode: int) -> int:
    """A process's exit status as a shell reports it: 128 + N when killed by signal N."""
    return 128 - returncode if returncode < 0 else returncode


def _echo(stream: IO[bytes], prefix: str, out: IO[str], lock: threading.Lock) -> None:
    for raw in iter(stream.readline, b""):
        line = raw.decode("utf-8", errors="replace").rstrip("\n")
        with lock:
            out.write(f"{prefix}{line}\n")
            out.flush()
    stream.close()


def _stop(processes: Sequence[subprocess.Popen], grace_s: float) -> None:
    """SIGTERM each live process's group, then SIGKILL what is left after `grace_s`."""
    for p in processes:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for p in processes:
        try:
            p.wait(timeout=max(deadline - time.monotonic(), 0.0))
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()


def _interrupt(signum, frame) -> None:
    del signum, frame
    raise KeyboardInterrupt


def run_hosts(
    command: Sequence[str],
    *,
    num_hosts: int,
    devices_per_host: int = 1,
    port: int | None = None,
    env: Mapping[str, str] | None = None,
    out: IO[str] | None = None,
    grace_s: float = GRACE_S,
) -> int:
    """Runs `command` as `num_hosts` hosts; returns the launcher's exit status."""
    if num_hosts < 1 or devices_per_host < 1:
        raise ValueError(
            f"--num_hosts ({num_hosts}) and --devices_per_host ({devices_per_host}) must be >= 1"
        )
    if not command:
        raise ValueError("no command given: put it after `--`")
    out = out or sys.stdout
    port = port or free_port()
    base = dict(os.environ if env is None else env)
    lock = threading.Lock()
    processes: list[subprocess.Popen] = []
    echoes: list[threading.Thread] = []
    previous = signal.getsignal(signal.SIGTERM)
    # SIGTERM to the launcher stops the hosts the way Ctrl-C does.
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _interrupt)
    status = 0
    try:
        for host in range(num_hosts):
            processes.append(
                subprocess.Popen(
                    list(command),
                    env=host_env(
                        base,
                        host=host,
                        num_hosts=num_hosts,
                        devices_per_host=devices_per_host,
                        port=port,
                    ),
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,  # its own process group, stopped as one
                )
            )
            thread = threading.Thread(
                target=_echo, args=(processes[-1].stdout, f"[host {host}] ", out, lock), daemon=True
            )
            thread.start()
            echoes.append(thread)
        running = list(range(num_hosts))
        while running:
            for host in list(running):
                code = processes[host].poll()
                if code is None:
                    continue
                running.remove(host)
                if code != 0:
                    status = exit_status(code)
                    with lock:
                        out.write(
                            f"[launcher] host {host} exited with status {status}; "
                            "stopping the others\n"
                        )
                    _stop(processes, grace_s)
                    running = []
                    break
            time.sleep(0.05)
    except KeyboardInterrupt:
        with lock:
            out.write("[launcher] interrupted: stopping every host\n")
        _stop(processes, grace_s)
        status = 130
    finally:
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, previous)
        for thread in echoes:
            thread.join(timeout=5)
    return status


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command: list[str] = []
    if "--" in argv:
        split = argv.index("--")
        argv, command = argv[:split], argv[split + 1 :]
    parser = argparse.ArgumentParser(
        prog="python -m launch.local_hosts",
        description="Run a command as N hosts of a multi-host JAX job on this machine.",
        usage="%(prog)s --num_hosts N [--devices_per_host K] [--port P] -- COMMAND ...",
    )
    parser.add_argument("--num_hosts", type=int, required=True, help="processes to start")
    parser.add_argument(
        "--devices_per_host", type=int, default=1, help="fake CPU devices per process"
    )
    parser.add_argument("--port", type=int, help="coordinator port (default: a free one)")
    args = parser.parse_args(argv)
    try:
        return run_hosts(
            command,
            num_hosts=args.num_hosts,
            devices_per_host=args.devices_per_host,
            port=args.port,
        )
    except (ValueError, OSError) as e:
        print(f"launch.local_hosts: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
