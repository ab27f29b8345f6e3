"""launch/sglang_server.sh: the flags it gives SGLang (run with `echo` as the Python)."""

import os
import pathlib
import subprocess

SCRIPT = pathlib.Path(__file__).parents[1] / "launch" / "sglang_server.sh"


def launch(tmp_path, **env):
    (tmp_path / "config.json").write_text("{}")
    out = subprocess.run(
        ["bash", str(SCRIPT), str(tmp_path), "31000"],
        env={**os.environ, "SGLANG_PYTHON": "echo", **env},
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.split(), out.stderr


def test_deterministic_inference_by_default_so_seeds_apply(tmp_path):
    args, _ = launch(tmp_path)
    assert "--enable-deterministic-inference" in args and "--port" in args
    assert "--tool-call-parser" not in args
    args, stderr = launch(tmp_path, DETERMINISTIC="0")
    assert "--enable-deterministic-inference" not in args and "ignores sampling_seed" in stderr


def test_parsers_for_an_expert_server(tmp_path):
    args, _ = launch(tmp_path, PARSERS="1")
    assert args[args.index("--tool-call-parser") + 1] == "qwen25"
    assert args[args.index("--reasoning-parser") + 1] == "qwen3"


def test_lora_rank_serves_adapters_beside_the_base(tmp_path):
    args, _ = launch(tmp_path)
    assert "--enable-lora" not in args
    args, _ = launch(tmp_path, LORA_RANK="64")
    assert "--enable-lora" in args and args[args.index("--max-lora-rank") + 1] == "64"
    assert args[args.index("--lora-target-modules") + 1] == "all"
    assert args[args.index("--max-loras-per-batch") + 1] == "2"


def test_loopback_by_default_and_a_wider_host_needs_the_api_key(tmp_path):
    os_env = {k: v for k, v in os.environ.items() if k not in ("HOST", "ROLLOUT_API_KEY")}
    (tmp_path / "config.json").write_text("{}")

    def start(**extra):
        return subprocess.run(
            ["bash", str(SCRIPT), str(tmp_path), "31000"],
            env={**os_env, "SGLANG_PYTHON": "echo", **extra},
            capture_output=True,
            text=True,
        )

    out = start()
    args = out.stdout.split()
    assert args[args.index("--host") + 1] == "127.0.0.1" and "--api-key" not in args
    out = start(HOST="0.0.0.0")
    assert out.returncode == 2 and "ROLLOUT_API_KEY" in out.stderr
    out = start(HOST="0.0.0.0", ROLLOUT_API_KEY="s3cret")
    args = out.stdout.split()
    assert args[args.index("--api-key") + 1] == "s3cret" and "s3cret" not in out.stderr
