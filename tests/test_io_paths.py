"""The path layer (orchestra_jax/io) on a local folder and on gs:// (a fake-gcs-server
bucket, tests/gcs_emulator.py): join, exists, text round trips, listing, rmtree,
the append-only JSON-lines log, the staged folder, and clear start-up errors."""

import json
import os
import pathlib
import subprocess
import sys
import uuid

import pytest

from orchestra_jax.io import paths
from orchestra_jax.io.jsonl_log import JsonlLog
from orchestra_jax.io.staging import StagedFolder


@pytest.fixture(params=["local", "gs"])
def root(request, tmp_path) -> str:
    """A fresh folder: local, or a prefix of the module's emulator bucket."""
    if request.param == "local":
        return str(tmp_path / "run")
    bucket = request.getfixturevalue("gcs_bucket")
    return f"{bucket}/{uuid.uuid4().hex[:8]}/run"


def test_uris_stay_uris_and_local_paths_become_absolute(tmp_path, monkeypatch):
    assert paths.is_remote("gs://b/x") and not paths.is_remote("/tmp/x")
    assert os.fspath(paths.as_path("gs://bucket/a/b")) == "gs://bucket/a/b"
    assert paths.join("gs://bucket/run", "checkpoints", "3") == "gs://bucket/run/checkpoints/3"
    monkeypatch.chdir(tmp_path)
    assert os.fspath(paths.as_path("runs/x")) == str(tmp_path / "runs" / "x")
    assert paths.join("runs/x", "metrics.jsonl") == os.path.join("runs/x", "metrics.jsonl")


def test_text_files_listing_and_rmtree(root):
    base = paths.as_path(root)
    assert not base.exists()
    paths.check_writable(root)  # leaves no probe behind
    # (An object store has no folders, only names: an empty "folder" does not exist.)
    assert base.exists() != paths.is_remote(root)
    paths.write_text_atomic(paths.join(root, "a.txt"), "first")
    paths.write_text_atomic(paths.join(root, "a.txt"), "second")  # replaces
    paths.write_text_atomic(paths.join(root, "sub", "deep", "b.json"), json.dumps({"x": 1}))
    assert (base / "a.txt").read_text() == "second"
    assert json.loads((base / "sub" / "deep" / "b.json").read_text()) == {"x": 1}
    assert sorted(p.name for p in base.iterdir()) == ["a.txt", "sub"]
    assert (base / "sub").is_dir() and (base / "sub" / "deep" / "b.json").exists()
    paths.rmtree(base / "sub")
    assert not (base / "sub" / "deep" / "b.json").exists()
    assert [p.name for p in base.iterdir()] == ["a.txt"]
    paths.rmtree(base / "never-made")  # nothing to do


def test_jsonl_log_appends_reopens_and_drops_torn_lines(root):
    path = paths.join(root, "log.jsonl")
    log = JsonlLog(path)
    for i in range(3):
        log.append({"step": i})
    log.flush()
    assert JsonlLog.read(path) == [{"step": 0}, {"step": 1}, {"step": 2}]
    log.close()
    # A torn last line (a writer killed mid-line) is dropped on opening, as are
    # records the caller's filter rejects; the file is rewritten without them.
    text = paths.as_path(path).read_text()
    paths.write_text_atomic(path, text + '{"step": 3, "rew')
    reopened = JsonlLog(path, keep=lambda r: r["step"] <= 1)
    assert reopened.records == [{"step": 0}, {"step": 1}] and reopened.dropped == 2
    assert JsonlLog.read(path) == [{"step": 0}, {"step": 1}]
    reopened.append({"step": 2})
    assert reopened.truncate(lambda r: r["step"] < 1) == 2
    reopened.append({"step": 5})
    reopened.close()
    assert JsonlLog.read(path) == [{"step": 0}, {"step": 5}]


def test_jsonl_log_on_an_object_store_is_written_on_flush(gcs_bucket):
    path = f"{gcs_bucket}/flush/log.jsonl"
    log = JsonlLog(path)
    log.append({"step": 1})
    assert not paths.as_path(path).exists()  # no append on GCS: uploaded whole on flush
    log.flush()
    log.append({"step": 2})
    assert JsonlLog.read(path) == [{"step": 1}]
    log.close()
    assert JsonlLog.read(path) == [{"step": 1}, {"step": 2}]


def test_staged_folder_uploads_new_and_changed_files(root):
    staged = StagedFolder(paths.join(root, "tb"))
    (staged.local / "events.1").write_bytes(b"abc")
    staged.upload()
    (staged.local / "events.1").write_bytes(b"abcdef")
    (staged.local / "events.2").write_bytes(b"x")
    staged.close()
    target = paths.as_path(root) / "tb"
    assert (target / "events.1").read_bytes() == b"abcdef"
    assert (target / "events.2").read_bytes() == b"x"


def test_an_invalid_bucket_name_is_a_clear_error():
    with pytest.raises(paths.WorkdirError, match="'ab' is not a valid bucket name"):
        paths.check_writable("gs://ab/run")


def test_half_an_emulator_setup_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", "http://127.0.0.1:9")
    monkeypatch.delenv("TENSORSTORE_GCS_HTTP_URL", raising=False)
    with pytest.raises(paths.WorkdirError, match="TENSORSTORE_GCS_HTTP_URL is not set"):
        paths.check_writable("gs://bucket/run")


def test_missing_credentials_are_a_clear_error(monkeypatch, tmp_path):
    for name in (*paths.EMULATOR_VARIABLES, "GOOGLE_AUTH_TOKEN_FOR_TESTING"):
        monkeypatch.delenv(name, raising=False)
    # No key file, no gcloud configuration, and no VM metadata server to ask.
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(tmp_path / "gcloud"))
    monkeypatch.delenv("GOOGLE_APPLICATION_CREDENTIALS", raising=False)
    monkeypatch.setenv("GCE_METADATA_HOST", "127.0.0.1:9")
    monkeypatch.setenv("GCE_METADATA_IP", "127.0.0.1:9")
    with pytest.raises(paths.WorkdirError, match="no Google Cloud credentials found"):
        paths.check_writable("gs://bucket/run")


def test_a_missing_bucket_names_the_emulator(gcs_emulator):
    with pytest.raises(paths.WorkdirError, match="does the bucket exist"):
        paths.check_writable("gs://no-such-bucket/run")


def test_the_entry_point_reports_a_bad_workdir_in_one_line(tmp_path):
    """`python -m experiments.grpo_hle` with a gs:// workdir it cannot use: an
    `error:` line naming the problem, exit status 1, no traceback."""
    root = pathlib.Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(root), "JAX_PLATFORMS": "cpu"}
    for name in (*paths.EMULATOR_VARIABLES, "GOOGLE_AUTH_TOKEN_FOR_TESTING"):
        env.pop(name, None)
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "experiments.grpo_hle",
            "--config=experiments/configs/grpo_hle.py:micro",
            "--config.workdir=gs://ab/runs/micro",
        ],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 1, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1] == (
        "error: workdir gs://ab/runs/micro: 'ab' is not a valid bucket name (3-63 characters: "
        "lowercase letters, digits, '-', '_', '.'; starting and ending with a letter or digit)"
    )
