"""The Python sandbox: hostile code fails, the host is unharmed, ordinary code works."""

import os
import socket

import pytest

from orchestra_jax.tools import python_sandbox
from orchestra_jax.tools.python_sandbox import run_python

pytestmark = pytest.mark.skipif(
    not python_sandbox.bwrap_available(), reason="needs bubblewrap (bwrap) and prlimit"
)


def test_ordinary_code_runs_and_reports_exit_codes():
    r = run_python("print(6 * 7)\nprint('hi')", timeout_s=5)
    assert r.ok and r.stdout == "42\nhi\n" and r.exit_code == 0
    r = run_python("raise ValueError('boom')", timeout_s=5)
    assert r.exit_code == 1 and "ValueError: boom" in r.stderr and not r.ok
    assert run_python("import sys; sys.exit(3)", timeout_s=5).exit_code == 3


def test_numpy_and_sympy_import():
    code = "import numpy as np, sympy\nprint(int(np.arange(5).sum()), sympy.factorint(12))"
    r = run_python(code, timeout_s=10)
    assert r.ok, r.stderr
    assert r.stdout.strip() == "10 {2: 2, 3: 1}"


def test_scratch_folder_is_writable_and_fresh():
    r = run_python("import os; open('a.txt','w').write('x'); print(os.listdir('.'))", timeout_s=5)
    assert r.ok and r.stdout.strip() == "['a.txt']"
    assert run_python("import os; print(os.listdir('.'))", timeout_s=5).stdout.strip() == "[]"


def test_cannot_reach_a_listener_on_the_host():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    port = server.getsockname()[1]
    r = run_python(
        f"import socket\nsocket.create_connection(('127.0.0.1', {port}), "
        "timeout=2)\nprint('connected')",
        timeout_s=5,
    )
    server.setblocking(False)
    with pytest.raises(BlockingIOError):  # nothing reached the host's backlog
        server.accept()
    server.close()
    assert "connected" not in r.stdout and r.exit_code != 0


def test_cannot_read_or_write_host_files(tmp_path):
    secret = tmp_path / "planted.txt"
    secret.write_text("host secret")
    r = run_python(f"print(open({str(secret)!r}).read())", timeout_s=5)
    assert "host secret" not in r.stdout and r.exit_code != 0
    target = tmp_path / "written.txt"
    r = run_python(f"open({str(target)!r}, 'w').write('pwned')", timeout_s=5)
    assert r.exit_code != 0 and not target.exists()
    r = run_python("open('/usr/pwned', 'w')", timeout_s=5)
    assert r.exit_code != 0 and not os.path.exists("/usr/pwned")


def test_cannot_read_host_environment(monkeypatch):
    monkeypatch.setenv("ORCHESTRA_TEST_SECRET", "s3cr3t-value")
    r = run_python(
        "import os; print(dict(os.environ)); print(open('/proc/1/environ','rb').read())",
        timeout_s=5,
    )
    assert "s3cr3t-value" not in r.stdout + r.stderr


def test_fork_bomb_is_contained():
    code = (
        "import os\nn = 0\ntry:\n  while n < 500:\n"
        "    if os.fork() == 0:\n      import time; time.sleep(0.5); os._exit(0)\n"
        "    n += 1\nexcept OSError:\n  pass\nprint(n)"
    )
    r = run_python(code, timeout_s=5, max_processes=16)
    assert r.stdout.strip() and int(r.stdout.strip()) < 16


def test_memory_bomb_is_contained():
    r = run_python("x = bytearray(2 * 1024**3)\nprint('allocated')", timeout_s=5, memory_mb=256)
    assert "allocated" not in r.stdout and "MemoryError" in r.stderr


def test_infinite_loop_is_killed():
    r = run_python("while True:\n  pass", timeout_s=1)
    assert r.timed_out and r.exit_code is None and not r.ok


def test_stdout_flood_is_capped():
    r = run_python("while True:\n  print('x' * 1000)", timeout_s=5, max_output_bytes=10_000)
    assert r.output_truncated and len(r.stdout) <= 10_000 and not r.ok


def test_cost_is_duration_times_price():
    r = run_python("print(1)", timeout_s=5)
    assert r.cost_usd(2.0) == pytest.approx(2.0 * r.duration_s)


def test_bad_arguments_are_rejected():
    with pytest.raises(ValueError, match="isolation"):
        run_python("print(1)", isolation="none")
    with pytest.raises(ValueError, match="timeout_s"):
        run_python("print(1)", timeout_s=0)
    with pytest.raises(ValueError, match="longer"):
        run_python("#" * (2 << 20))


def test_missing_bubblewrap_is_a_clear_error(monkeypatch):
    real_which = python_sandbox.shutil.which
    monkeypatch.setattr(
        python_sandbox.shutil, "which", lambda name: None if name == "bwrap" else real_which(name)
    )
    with pytest.raises(python_sandbox.SandboxUnavailable, match="bubblewrap"):
        run_python("print(1)")
