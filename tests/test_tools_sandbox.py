"""The escape suite: every sandbox backend, the same hostile programs.

Each test is one escape of `sandbox_base.ESCAPES` (or ordinary use), run on
every backend that runs on this machine. A backend that declares an escape
unblocked skips that test, saying so; `test_declared_escapes_are_real` checks
that such a declaration is true (the warning is not crying wolf).
"""

import os
import socket
import subprocess
import sys
import time
import uuid

import pytest

from orchestra_jax.tools.sandbox import registry as python_sandbox
from orchestra_jax.tools.sandbox.base import ESCAPES
from orchestra_jax.tools.sandbox.registry import run_python

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BACKENDS = ("bwrap", "wasm", "rlimits")


@pytest.fixture(params=BACKENDS)
def backend(request):
    """A backend name; skips where the backend does not run here, saying why."""
    reason = python_sandbox.get_sandbox(request.param).unavailable_reason()
    if reason:
        pytest.skip(f"{request.param} does not run here: {reason}")
    return request.param


def needs_blocked(backend: str, escape: str) -> None:
    assert escape in ESCAPES
    if escape in python_sandbox.get_sandbox(backend).unblocked:
        pytest.skip(f"{backend} declares it does not block {escape}")


def test_ordinary_code_runs_and_reports_exit_codes(backend):
    r = run_python("print(6 * 7)\nprint('hi')", timeout_s=5, isolation=backend)
    assert r.ok and r.stdout == "42\nhi\n" and r.exit_code == 0
    r = run_python("raise ValueError('boom')", timeout_s=5, isolation=backend)
    assert r.exit_code == 1 and "ValueError: boom" in r.stderr and not r.ok
    assert 'File "<stdin>", line 1' in r.stderr
    assert run_python("import sys; sys.exit(3)", timeout_s=5, isolation=backend).exit_code == 3
    r = run_python("def f(:\n  pass", timeout_s=5, isolation=backend)
    assert r.exit_code == 1 and "SyntaxError" in r.stderr


def test_numpy_and_sympy_import(backend):
    code = "import numpy as np, sympy\nprint(int(np.arange(5).sum()), sympy.factorint(12))"
    r = run_python(code, timeout_s=30, isolation=backend)
    assert r.ok, r.stderr
    assert r.stdout.strip() == "10 {2: 2, 3: 1}"


def test_scratch_folder_is_writable_and_fresh(backend):
    code = "import os; open('a.txt','w').write('x'); os.mkdir('d'); print(sorted(os.listdir('.')))"
    r = run_python(code, timeout_s=5, isolation=backend)
    assert r.ok and r.stdout.strip() == "['a.txt', 'd']", r.stderr
    r = run_python("import os; print(os.listdir('.'))", timeout_s=5, isolation=backend)
    assert r.stdout.strip() == "[]"


def test_scratch_folder_is_bounded(backend):
    # 40 files of 40 kB into a 1 MB scratch folder: the disk fills up, the host is untouched.
    code = (
        "import os\nn = 0\ntry:\n  for i in range(40):\n"
        "    with open(f'f{i}', 'wb') as f: f.write(b'x' * 40_000)\n"
        "    n += 1\nexcept OSError as e:\n  print('refused', e.errno)\nprint(n)"
    )
    needs_blocked(backend, "writes_outside_scratch")
    r = run_python(code, timeout_s=5, scratch_mb=1, isolation=backend)
    assert "refused" in r.stdout, (r.stdout, r.stderr)
    assert int(r.stdout.split()[-1]) < 30


def test_network_is_blocked(backend):
    needs_blocked(backend, "network")
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    port = server.getsockname()[1]
    r = run_python(
        f"import socket\nsocket.create_connection(('127.0.0.1', {port}), "
        "timeout=2)\nprint('connected')",
        timeout_s=5,
        isolation=backend,
    )
    server.setblocking(False)
    with pytest.raises(BlockingIOError):  # nothing reached the host's backlog
        server.accept()
    server.close()
    assert "connected" not in r.stdout and r.exit_code != 0


def test_host_files_cannot_be_read(backend, tmp_path):
    needs_blocked(backend, "host_files")
    secret = tmp_path / "planted.txt"
    secret.write_text("host secret")
    r = run_python(f"print(open({str(secret)!r}).read())", timeout_s=5, isolation=backend)
    assert "host secret" not in r.stdout and r.exit_code != 0
    r = run_python(f"print(open({__file__!r}).read())", timeout_s=5, isolation=backend)
    assert "escape suite" not in r.stdout and r.exit_code != 0


def test_writes_outside_scratch_fail(backend, tmp_path):
    needs_blocked(backend, "writes_outside_scratch")
    target = tmp_path / "written.txt"
    r = run_python(f"open({str(target)!r}, 'w').write('pwned')", timeout_s=5, isolation=backend)
    assert r.exit_code != 0 and not target.exists()
    marker = f"/tmp/orchestra-escape-{uuid.uuid4().hex}"
    r = run_python(f"open({marker!r}, 'w').write('pwned')", timeout_s=5, isolation=backend)
    assert not os.path.exists(marker)
    r = run_python("open('/usr/pwned', 'w')", timeout_s=5, isolation=backend)
    assert r.exit_code != 0 and not os.path.exists("/usr/pwned")


def test_busy_loop_is_stopped_at_the_time_limit(backend):
    needs_blocked(backend, "cpu_time")
    r = run_python("while True:\n  pass", timeout_s=1, isolation=backend)
    assert r.timed_out and r.exit_code is None and not r.ok
    assert r.duration_s < 10


def test_sleeping_program_is_stopped_at_the_time_limit(backend):
    needs_blocked(backend, "wall_time")
    r = run_python("import time; time.sleep(60); print('woke')", timeout_s=1, isolation=backend)
    assert r.timed_out and "woke" not in r.stdout and r.duration_s < 10


def test_memory_bomb_is_contained(backend):
    needs_blocked(backend, "memory")
    r = run_python(
        "x = bytearray(1024**3)\nprint('allocated')", timeout_s=5, memory_mb=256, isolation=backend
    )
    assert "allocated" not in r.stdout and "MemoryError" in r.stderr


def test_fork_bomb_is_contained(backend):
    needs_blocked(backend, "fork_bomb")
    code = (
        "import os, time\nn = 0\ntry:\n  while n < 500:\n"
        "    if os.fork() == 0:\n      time.sleep(0.5); os._exit(0)\n"
        "    n += 1\nexcept (OSError, AttributeError):\n  pass\nprint(n)"
    )
    r = run_python(code, timeout_s=5, max_processes=16, isolation=backend)
    assert r.stdout.strip() and int(r.stdout.strip()) < 16, (r.stdout, r.stderr)


def _processes_with(marker: str) -> list[int]:
    found = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    if marker.encode() in f.read():
                        found.append(int(pid))
            except OSError:
                pass
    return found


@pytest.mark.parametrize("ending", ["exits", "times_out"])
def test_detached_children_do_not_survive(backend, ending):
    needs_blocked(backend, "detached_survivors")
    marker = f"orchestra-survivor-{uuid.uuid4().hex}"
    code = (
        "import subprocess, sys\n"
        "try:\n"
        "  subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)', "
        f"'{marker}'], start_new_session=True, stdout=subprocess.DEVNULL, "
        "stderr=subprocess.DEVNULL)\n"
        "  print('started', flush=True)\n"
        "except OSError as e:\n  print('no processes:', e, flush=True)\n"
    ) + ("import time; time.sleep(60)\n" if ending == "times_out" else "")
    r = run_python(code, timeout_s=2, isolation=backend)
    assert r.stdout.strip(), r.stderr
    deadline = time.monotonic() + 5
    while _processes_with(marker) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _processes_with(marker)


def test_output_flood_is_capped(backend):
    needs_blocked(backend, "output_flood")
    r = run_python(
        "while True:\n  print('x' * 1000)", timeout_s=5, max_output_bytes=10_000, isolation=backend
    )
    assert r.output_truncated and len(r.stdout) <= 10_000 and not r.ok


CALLER = """
import os, sys
from orchestra_jax.tools.sandbox.registry import run_python
code = sys.stdin.read().replace("CALLER_PID", str(os.getpid()))
r = run_python(code, timeout_s=5, isolation=sys.argv[1])
print("caller alive", r.exit_code, r.timed_out)
print(r.stdout, r.stderr)
"""


def run_from_a_caller(backend: str, code: str, **env: str) -> subprocess.CompletedProcess:
    """Runs `code` sandboxed from a fresh Python process (the caller) started with `env`
    added to its environment; CALLER_PID in `code` is the caller's pid."""
    return subprocess.run(
        [sys.executable, "-c", CALLER, backend],
        input=code,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
        env=dict(os.environ, PYTHONPATH=ROOT, **env),
        start_new_session=True,  # a process-group kill reaches the caller, never pytest
    )


KILLERS = {
    "signals": (
        "import os, signal\n"
        "for target in (CALLER_PID, os.getppid()):\n"
        "  try: os.kill(target, signal.SIGKILL)\n"
        "  except (OSError, AttributeError) as e: print(e)\n"
        "try: os.killpg(os.getpgid(os.getppid()), signal.SIGKILL)\n"
        "except (OSError, AttributeError) as e: print(e)\n"
    ),
    "deep_recursion": (
        "import sys\nsys.setrecursionlimit(10**7)\ndef f(n):\n  return f(n + 1)\nf(0)"
    ),
    "abort": "import os\nos.abort()",
}


@pytest.mark.parametrize("attack", sorted(KILLERS))
def test_caller_survives(backend, attack):
    needs_blocked(backend, "kill_caller")
    caller = run_from_a_caller(backend, KILLERS[attack])
    assert caller.returncode == 0, caller.stderr[-2000:]
    assert "caller alive" in caller.stdout


def test_caller_environment_is_hidden(backend):
    needs_blocked(backend, "environment")
    code = (
        "import os; print(dict(os.environ))\n"
        "for p in ('/proc/1/environ', '/proc/CALLER_PID/environ', '/proc/self/environ'):\n"
        "  try: print(open(p, 'rb').read())\n"
        "  except OSError as e: print(p, e)\n"
        "try: print(open(f'/proc/{os.getppid()}/environ', 'rb').read())\n"
        "except (OSError, AttributeError) as e: print(e)"
    )
    caller = run_from_a_caller(backend, code, ORCHESTRA_TEST_SECRET="s3cr3t-value")
    assert "caller alive 0" in caller.stdout, caller.stdout + caller.stderr[-2000:]
    assert "s3cr3t-value" not in caller.stdout + caller.stderr


def test_declared_escapes_are_real(tmp_path):
    """rlimits says it leaves host files readable and writable: it does."""
    sandbox = python_sandbox.get_sandbox("rlimits")
    if sandbox.unavailable_reason():
        pytest.skip(sandbox.unavailable_reason())
    assert {"host_files", "writes_outside_scratch"} <= set(sandbox.unblocked)
    secret = tmp_path / "planted.txt"
    secret.write_text("host secret")
    r = run_python(f"print(open({str(secret)!r}).read())", timeout_s=5, isolation="rlimits")
    assert "host secret" in r.stdout


def test_cost_is_duration_times_price(backend):
    r = run_python("print(1)", timeout_s=5, isolation=backend)
    assert r.cost_usd(2.0) == pytest.approx(2.0 * r.duration_s)


def test_bad_arguments_are_rejected():
    with pytest.raises(ValueError, match="isolation"):
        run_python("print(1)", isolation="none")
    with pytest.raises(ValueError, match="timeout_s"):
        run_python("print(1)", timeout_s=0)
    with pytest.raises(ValueError, match="longer"):
        run_python("#" * (2 << 20))


def test_missing_bubblewrap_is_a_clear_error(monkeypatch):
    from orchestra_jax.tools.sandbox import bwrap as sandbox_bwrap

    monkeypatch.setattr(sandbox_bwrap, "find_bwrap", lambda: None)
    with pytest.raises(python_sandbox.SandboxUnavailable, match="bubblewrap|bwrap"):
        run_python("print(1)", isolation="bwrap")


def test_bwrap_runs_a_virtual_environments_own_packages(tmp_path):
    """A venv's interpreter is a link to the base Python: run as given, not resolved,
    so the sandboxed program sees the environment's site-packages."""
    from orchestra_jax.tools.sandbox.base import SandboxLimits
    from orchestra_jax.tools.sandbox.bwrap import BubblewrapSandbox

    if python_sandbox.get_sandbox("bwrap").unavailable_reason():
        pytest.skip("bwrap does not run here")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    (site,) = venv.glob("lib/python3*/site-packages")
    (site / "orchestra_venv_marker.py").write_text("WHERE = 'venv'\n")
    sandbox = BubblewrapSandbox(python=str(venv / "bin" / "python"))
    r = sandbox.run(
        "import orchestra_venv_marker as m; print(m.WHERE)", SandboxLimits(timeout_s=10)
    )
    assert r.ok and r.stdout == "venv\n", r.stderr
