"""The probe process confines generated code: a tool that loops forever times out, one
that kills its process is a crash, one that prints to file descriptor 1 cannot garble
the answers; each failure costs only its own request (the next one starts a fresh
process). Needs the `tau2` extra and ../shared/tau2-bench.
"""

import json

import pytest

from orchestra_jax.synthesis.probe import ProbeLimits, Prober
from tests import synthesis_script as script

GOOD = "return self.db.books[book_id]"


def folder_with(tmp_path, name, body):
    folder = tmp_path / name / "library"
    folder.mkdir(parents=True)
    (folder / "data_model.py").write_text(script.DATA_MODEL)
    (folder / "db.json").write_text(json.dumps(script.BATCH_0))
    (folder / "tools.py").write_text(script.TOOLS.replace(GOOD, body))
    return {"kind": "tools", "folder": str(folder), "examples": script.EXAMPLES}


def test_loops_crashes_and_prints_cost_only_their_own_request(tau2_data, tmp_path):
    assert GOOD in script.TOOLS
    loop = folder_with(tmp_path, "loop", "while True:\n            pass")
    crash = folder_with(tmp_path, "crash", "import os\n        os._exit(3)")
    noisy = folder_with(
        tmp_path,
        "noisy",
        "import os\n        os.write(1, b'@@probe-resul')\n        print('noise')\n        " + GOOD,
    )
    good = folder_with(tmp_path, "good", GOOD)
    with Prober(ProbeLimits(timeout_s=5.0), tau2_data_dir=str(tau2_data)) as prober:
        results = prober.run([loop, good, crash, noisy, good])
        assert [r["ok"] for r in results] == [False, True, False, True, True]
        assert results[0]["reason"] == "timeout"
        assert results[2]["reason"] == "crash"
        assert results[1]["tools"]["borrow_book"] == "write"
        assert prober.processes == 1  # a failure kills only its own forked child


def test_the_probes_need_tau2s_data_folder(monkeypatch):
    monkeypatch.delenv("TAU2_DATA_DIR", raising=False)
    with pytest.raises(ValueError, match="TAU2_DATA_DIR"):
        Prober()
