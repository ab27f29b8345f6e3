"""Test-wide set-up: 8 fake CPU devices for mesh tests, shared/ discovery."""

import os
import pathlib

# Must happen before JAX initialises its backends (first jax import in a test).
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import pytest  # noqa: E402

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
SHARED = REPO_ROOT.parent / "shared"


@pytest.fixture(scope="session")
def shared_dir() -> pathlib.Path:
    """`../shared` beside the clone; tests that need it skip, saying why."""
    if not (SHARED / "DESIGN.md").exists():
        pytest.skip(f"needs ../shared beside the clone (looked in {SHARED})")
    return SHARED


@pytest.fixture(scope="session")
def qwen3_dir(shared_dir) -> pathlib.Path:
    path = shared_dir / "qwen3"
    if not (path / "tokenizer.json").exists():
        pytest.skip(f"needs the real Qwen3 tokenizer in {path}")
    return path
