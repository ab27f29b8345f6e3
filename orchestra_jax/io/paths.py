"""Paths of a run's files, local or on an object store: `etils.epath.Path`.

Every file the stack keeps under a workdir (checkpoints, metrics, TensorBoard
events, trajectories, evaluation files, the judge cache, the warm-start
parameters, HF folders written for servers) is named by an `epath.Path`, the
path class Orbax uses itself. A local path behaves as a `pathlib.Path`; a
`gs://bucket/...` URI goes to Google Cloud Storage through fsspec's `gcsfs`
(through `tf.io.gfile` instead where TensorFlow is installed). The arrays of
Orbax checkpoints travel through tensorstore's own GCS driver.

`as_path(p)` is the one way in: local paths become absolute (Orbax needs
that), URIs stay as they are (`os.path.abspath` would make `gs://b/x` the local
folder `<cwd>/gs:/b/x`). Joining, `exists`, `read_text`, `write_text`,
`iterdir`, `mkdir` are epath's own.

Object stores have no folders, only object names: `mkdir` does nothing there,
and a "folder" exists (and lists) while an object's name starts with it.
They have no rename and no append either: an object is uploaded whole and
replaces the previous one atomically (a reader sees the old or the new
object, never part of one). `write_text_atomic` writes a file readers never
see half-written on both kinds; append-only logs are `jsonl_log.JsonlLog`.

`check_writable(workdir)` writes and deletes a probe file, so a `gs://`
workdir without credentials, without `gcsfs`, or with half an emulator
set-up fails at start-up with a message that names what is missing.

Testing against an emulator (fake-gcs-server, `tests/gcs_emulator.py`):
`STORAGE_EMULATOR_HOST=http://127.0.0.1:PORT` (gcsfs, google-cloud-storage),
`TENSORSTORE_GCS_HTTP_URL=http://127.0.0.1:PORT` and
`GOOGLE_AUTH_TOKEN_FOR_TESTING=<any>` (tensorstore, i.e. checkpoint arrays),
and `GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false` (gcsfs otherwise asks Google's
storage-control API, which no emulator serves, what kind each bucket is).
"""

from __future__ import annotations

import os
import re
import uuid

from etils import epath

REMOTE_SCHEMES = ("gs://", "s3://", "az://", "hf://")

EMULATOR_VARIABLES = ("STORAGE_EMULATOR_HOST", "TENSORSTORE_GCS_HTTP_URL")

# Google Cloud Storage's bucket names (tensorstore refuses others, late, in a writer thread).
_GCS_BUCKET = re.compile(r"[a-z0-9][a-z0-9._-]{1,61}[a-z0-9]")


class WorkdirError(RuntimeError):
    """A workdir that cannot be written (says what is missing)."""


def is_remote(path: str | os.PathLike) -> bool:
    """True for object-store URIs (`gs://…`), False for local paths."""
    return os.fspath(path).startswith(REMOTE_SCHEMES)


def as_path(path: str | os.PathLike) -> epath.Path:
    """`path` as an `epath.Path`: local paths absolute, URIs unchanged."""
    if is_remote(path):
        return epath.Path(os.fspath(path))
    return epath.Path(os.path.abspath(os.fspath(path)))


def join(path: str | os.PathLike, *parts: str) -> str:
    """`os.path.join` that keeps a URI a URI (`join("gs://b/run", "x")` →
    `"gs://b/run/x"`); for config-level strings, e.g. a workdir's files."""
    return os.fspath(epath.Path(os.fspath(path)).joinpath(*parts))


def write_text_atomic(path: str | os.PathLike, text: str) -> epath.Path:
    """Writes `text` to `path` so that no reader sees a partial file; parent folders
    are created. Local: a temporary file renamed over `path`; object store: one
    upload, which replaces the object atomically."""
    path = as_path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if is_remote(path):
        path.write_text(text, encoding="utf-8")
        return path
    tmp = path.with_name(f"{path.name}.tmp-{uuid.uuid4().hex[:8]}")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
    return path


def rmtree(path: str | os.PathLike) -> None:
    """Deletes a folder and everything under it; nothing if it does not exist."""
    path = as_path(path)
    if path.exists():
        path.rmtree()


def check_writable(workdir: str | os.PathLike) -> epath.Path:
    """Creates `workdir`, writes and deletes a probe file in it; a failure raises
    `WorkdirError` naming what is missing (credentials, gcsfs, emulator variables)."""
    path = as_path(workdir)
    if os.fspath(path).startswith("gs://"):
        _check_gcs_setup(path)
    probe = path / f".write_probe-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe.write_text("ok")
        if probe.read_text() != "ok":
            raise OSError(f"{probe} read back differently")
        probe.unlink()
    except ImportError as e:
        raise WorkdirError(
            f"workdir {path}: {e}. A gs:// workdir needs gcsfs (pip install gcsfs; "
            "orchestra_jax installs it)"
        ) from e
    except Exception as e:  # any client error becomes one clear message
        raise WorkdirError(f"workdir {path} cannot be written: {_reason(path, e)}") from e
    return path


def _check_gcs_setup(path: epath.Path) -> None:
    bucket = os.fspath(path)[len("gs://") :].split("/", 1)[0]
    if not _GCS_BUCKET.fullmatch(bucket):
        raise WorkdirError(
            f"workdir {path}: {bucket!r} is not a valid bucket name (3-63 characters: "
            "lowercase letters, digits, '-', '_', '.'; starting and ending with a letter or digit)"
        )
    half = [name for name in EMULATOR_VARIABLES if os.environ.get(name)]
    if not half:
        _check_credentials(path)
    if half and len(half) < len(EMULATOR_VARIABLES):
        missing = sorted(set(EMULATOR_VARIABLES) - set(half))
        raise WorkdirError(
            f"workdir {path}: {half[0]} points at a storage emulator but {', '.join(missing)} "
            "is not set: checkpoint arrays (tensorstore) and the other files (gcsfs) would "
            "go to different places. Set both to the emulator's URL (and "
            "GOOGLE_AUTH_TOKEN_FOR_TESTING to any value), or neither for Google Cloud Storage"
        )
    if os.environ.get("TENSORSTORE_GCS_HTTP_URL") and not os.environ.get(
        "GOOGLE_AUTH_TOKEN_FOR_TESTING"
    ):
        raise WorkdirError(
            f"workdir {path}: TENSORSTORE_GCS_HTTP_URL is set (a storage emulator) but "
            "GOOGLE_AUTH_TOKEN_FOR_TESTING is not: tensorstore would look for Google "
            "credentials. Set it to any value"
        )


def _check_credentials(path: epath.Path) -> None:
    """Google Cloud credentials must be found before any request (gcsfs would retry
    anonymous requests for a minute); the check is google-auth's own lookup."""
    try:
        import google.auth  # pylint: disable=g-import-not-at-top
        import google.auth.exceptions  # pylint: disable=g-import-not-at-top
    except ImportError as e:
        raise WorkdirError(
            f"workdir {path}: a gs:// workdir needs gcsfs and google-auth ({e}); "
            "pip install gcsfs (orchestra_jax installs it)"
        ) from e
    try:
        google.auth.default()
    except google.auth.exceptions.DefaultCredentialsError as e:
        raise WorkdirError(
            f"workdir {path}: no Google Cloud credentials found ({e}). Run "
            "`gcloud auth application-default login`, set GOOGLE_APPLICATION_CREDENTIALS to a "
            "service account key file, or run on a VM whose service account may write to the "
            "bucket; to use a storage emulator instead set STORAGE_EMULATOR_HOST, "
            "TENSORSTORE_GCS_HTTP_URL and GOOGLE_AUTH_TOKEN_FOR_TESTING (launch/README.md)"
        ) from None


def _reason(path: epath.Path, error: Exception) -> str:
    text = f"{type(error).__name__}: {error}"
    if not is_remote(path):
        return text
    if os.environ.get("STORAGE_EMULATOR_HOST"):
        return f"{text} (storage emulator at {os.environ['STORAGE_EMULATOR_HOST']}; does the bucket exist?)"
    return (
        f"{text}. A gs:// workdir needs Google Cloud credentials with write access to the "
        "bucket: Application Default Credentials (`gcloud auth application-default login`, "
        "GOOGLE_APPLICATION_CREDENTIALS, or a VM's service account); for a storage "
        "emulator set STORAGE_EMULATOR_HOST, TENSORSTORE_GCS_HTTP_URL and "
        "GOOGLE_AUTH_TOKEN_FOR_TESTING (launch/README.md)"
    )
