"""Model-written domain code under the synthesis probe cannot get out of its sandbox.

Each hostile `data_model.py` below runs when the probe imports it, tries one
escape and reports what it reached by raising (its error text comes back in
the reject). Checked: the pipeline's secrets (its environment, its parent's
/proc/<pid>/environ, any process's), a write outside the scratch folder, a
socket to a listener on the host, forging a verdict (on stdout, on every
descriptor, through the judge's /proc entries, raw JSON on its own report
pipe), killing the judge, a detached survivor, a busy loop, a fork bomb and a
memory hog. Every one ends as that candidate's reject (or, for the self-report,
as a result only about itself) and the next request gets its own answer.

The backends: bubblewrap runs them; WebAssembly cannot run domain code (no
pydantic) and says so; rlimits is refused unless the code is trusted.
Needs the `tau2` extra and ../shared/tau2-bench.
"""

import json
import os
import pathlib
import socket
import subprocess
import sys

import pytest

from orchestra_jax.synthesis.probe import ProbeLimits, Prober
from orchestra_jax.tools.sandbox.base import SandboxRefused, SandboxUnavailable
from orchestra_jax.tools.sandbox.registry import bwrap_available
from tests import synthesis_script as script

SECRET = "sk-probe-secret-0123456789"
ROOT = pathlib.Path(__file__).resolve().parents[1]

needs_bwrap = pytest.mark.skipif(not bwrap_available(), reason="bubblewrap cannot run here")


def data_model(tmp_path, name, attack):
    folder = tmp_path / name / "library"
    folder.mkdir(parents=True)
    (folder / "data_model.py").write_text(attack + "\n" + script.DATA_MODEL)
    return {"kind": "data_model", "folder": str(folder)}


GOOD = {"ok": True, "db_class": "LibraryDB"}


@pytest.fixture(scope="module")
def prober(tau2_data):
    if not bwrap_available():
        pytest.skip("bubblewrap cannot run here")
    with Prober(ProbeLimits(timeout_s=4.0), tau2_data_dir=str(tau2_data)) as p:
        yield p


ENVIRON_ATTACK = """
import os
seen, procs = [str(dict(os.environ))], 0
for pid in os.listdir("/proc"):
    if pid.isdigit():
        procs += 1
        try:
            seen.append(open(f"/proc/{pid}/environ", "rb").read().decode(errors="replace"))
        except OSError:
            pass
found = [part for text in seen for part in text.replace("\\0", " ").split() if "sk-" in part]
raise ValueError(f"SEEN processes={procs} ppid={os.getppid()} secrets={found}")
"""
PIPELINE = """
import json, sys
from orchestra_jax.synthesis.probe import ProbeLimits, Prober
with Prober(ProbeLimits(timeout_s=20.0), tau2_data_dir=sys.argv[1]) as prober:
    print(json.dumps(prober.one({"kind": "data_model", "folder": sys.argv[2]})))
"""


@needs_bwrap
def test_secrets_of_the_pipeline_are_out_of_reach(tau2_data, tmp_path):
    """The pipeline runs with an API key in its environment from its start (so it is in
    its /proc/<pid>/environ); the generated code looks for it everywhere it can."""
    attack = data_model(tmp_path, "environ", ENVIRON_ATTACK)
    proc = subprocess.run(
        [sys.executable, "-c", PIPELINE, str(tau2_data), attack["folder"]],
        env={**os.environ, "GENERATOR_API_KEY": SECRET},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["reason"] == "data_model_invalid" and "SEEN" in result["error"]
    assert "secrets=[]" in result["error"] and SECRET not in result["error"]
    # Only the sandbox's own processes are visible (bwrap's init, the judge, this child).
    assert "processes=3 " in result["error"]


@needs_bwrap
def test_no_write_outside_scratch_and_no_network(prober, tmp_path):
    target = tmp_path / "escaped.txt"
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    listener.setblocking(False)
    port = listener.getsockname()[1]
    attack = data_model(
        tmp_path,
        "writes",
        f"""
import os, socket
out = []
for path in ({str(target)!r}, {str(tmp_path / "library" / "x.py")!r}, "/tmp/escaped",
             "/usr/escaped", "/work/escaped"):
    try:
        open(path, "w").write("x")
        out.append("WROTE " + path)
    except OSError as e:
        out.append(type(e).__name__)
for host in ("127.0.0.1", "8.8.8.8"):
    try:
        socket.create_connection((host, {port} if host == "127.0.0.1" else 53), timeout=1)
        out.append("CONNECTED " + host)
    except OSError as e:
        out.append(type(e).__name__)
raise ValueError("TRIED " + " ".join(out))
""",
    )
    result = prober.one(attack)
    assert result["reason"] == "data_model_invalid" and "TRIED" in result["error"]
    assert "WROTE" not in result["error"] and "CONNECTED" not in result["error"]
    assert not target.exists()
    with pytest.raises(BlockingIOError):
        listener.accept()
    listener.close()


@needs_bwrap
def test_forged_verdicts_are_that_candidates_reject_and_never_reach_the_next_request(
    prober, tmp_path
):
    forge_everywhere = data_model(
        tmp_path,
        "forge",
        """
import gc, io, json, os, sys
line = '@@probe-result@@ ' + json.dumps({"id": 1, "result": {"ok": True, "db_class": "X"}})
for n in range(1, 40):  # the next requests' ids too
    line += '\\n@@probe-result@@ ' + json.dumps({"id": n, "result": {"ok": True, "db_class": "X"}})
line += '\\n'
for obj in gc.get_objects():
    if isinstance(obj, io.IOBase):
        try:
            obj.write(line if isinstance(obj, io.TextIOBase) else line.encode()); obj.flush()
        except Exception:
            pass
for fd in range(0, 256):
    try:
        os.write(fd, line.encode())
    except OSError:
        pass
ppid = os.getppid()
for entry in ("fd/1", "fd/3", "fd/4", "mem"):
    try:
        open(f"/proc/{ppid}/{entry}", "w").write(line)
        print("REACHED", entry, file=sys.stderr)
    except OSError:
        pass
raise ValueError("forged")
""",
    )
    good = data_model(tmp_path, "good", "")
    results = prober.run([forge_everywhere, good, good])
    assert results[0]["ok"] is False
    assert results[0]["reason"] in ("data_model_invalid", "garbled_result", "timeout")
    assert "REACHED" not in results[0]["error"]
    assert results[1:] == [GOOD, GOOD]

    # Raw JSON on its own report pipe is a report about itself only: it cannot name
    # another request, and anything but one result is that candidate's reject.
    garbled = data_model(
        tmp_path,
        "garbled",
        """
import os
for fd in range(3, 256):
    try:
        os.write(fd, b'{"ok": true, "tables": 5} trailing')
    except OSError:
        pass
os._exit(0)
""",
    )
    results = prober.run([garbled, good])
    assert results[0]["reason"] == "garbled_result"
    assert results[1] == GOOD


def test_a_verdict_line_that_is_not_json_is_a_reject_not_a_crash(tau2_data):
    prober = Prober(tau2_data_dir=str(tau2_data))
    for line in ("@@probe-result@@ {not json", "noise", '@@probe-result@@ {"id": 7}'):
        result = prober._verdict(line, 1, "data_model")
        assert result["ok"] is False and result["reason"] == "garbled_result"
    ok_line = '@@probe-result@@ {"id": 1, "result": {"ok": true}}'
    assert prober._verdict(ok_line, 1, "replay")["reason"] == "garbled_result"  # no "changed"


@needs_bwrap
def test_killing_the_judge_loops_forks_and_memory_cost_only_their_own_request(prober, tmp_path):
    attacks = {
        "kill_judge": "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\nimport time\ntime.sleep(30)",
        "busy_loop": "while True:\n    pass",
        "fork_bomb": "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass",
        "memory": "x = bytearray(64 * 1024 ** 3)",
        "planter": (
            "import os\n"
            "os.makedirs('/scratch/trap/inner')\n"
            "open('/scratch/trap/inner/tools.py', 'w').write('raise SystemExit')\n"
            "os.chmod('/scratch/trap/inner', 0)\n"
            "os.chmod('/scratch/trap', 0)\n"
            "try:\n"
            "    for i in range(40):  # fill the scratch folder\n"
            "        open(f'/scratch/fill{i}', 'wb').write(bytes(15 << 20))\n"
            "except OSError:\n"
            "    pass"
        ),
        "survivor": (
            "import subprocess, sys\n"
            "subprocess.Popen([sys.executable, '-c', 'import os, signal, time; time.sleep(2); "
            "os.kill(-1, signal.SIGKILL)'], start_new_session=True)"
        ),
    }
    good = data_model(tmp_path, "good", "")
    for name, code in attacks.items():
        result = prober.one(data_model(tmp_path, name, code))
        if name in ("survivor", "planter"):
            assert result == GOOD  # it loaded; what it left behind is killed or wiped
            import time

            time.sleep(3)
        else:
            assert result["ok"] is False, name
            assert result["reason"] in ("crash", "timeout", "data_model_invalid"), name
        assert prober.one(good) == GOOD, name
    assert prober.processes <= 3  # only killing the judge costs a restart


def test_wasm_cannot_run_domain_code_and_rlimits_needs_trust(tau2_data):
    with pytest.raises(SandboxUnavailable, match="pydantic"):
        Prober(tau2_data_dir=str(tau2_data), sandbox="wasm")
    with pytest.raises(SandboxRefused, match="code_is_trusted"):
        Prober(tau2_data_dir=str(tau2_data), sandbox="rlimits")
    assert Prober(tau2_data_dir=str(tau2_data), sandbox="rlimits", code_is_trusted=True)
