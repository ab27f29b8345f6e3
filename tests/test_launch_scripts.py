"""The TPU pod, GPU node and Slurm launch scripts, in DRY_RUN mode (nothing is started)."""

import os
import pathlib
import shutil
import subprocess

import pytest

LAUNCH = pathlib.Path(__file__).resolve().parents[1] / "launch"
SCRIPTS = ("tpu_pod.sh", "gpu_node.sh", "slurm_gpu.sbatch")
CLEARED = (
    "TPU_NAME",
    "TPU_ZONE",
    "TPU_PROJECT",
    "LEARNER_GPUS",
    "SGLANG_URLS",
    "SGLANG_GPUS",
    "SGLANG_MODEL",
    "SGLANG_WEIGHTS_DIR",
    "SGLANG_TP",
    "JAX_COORDINATOR_ADDRESS",
    "JAX_NUM_PROCESSES",
    "JAX_PROCESS_ID",
    "SLURM_PROCID",
    "SLURM_JOB_NODELIST",
    "SGLANG_HOST",
    "ROLLOUT_API_KEY",
)


def run_script(name, *args, **env):
    clean = {k: v for k, v in os.environ.items() if k not in CLEARED}
    return subprocess.run(
        ["bash", str(LAUNCH / name), *args],
        env={**clean, "DRY_RUN": "1", **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def commands(result):
    return [line for line in result.stdout.splitlines() if line.startswith("+ ")]


@pytest.mark.parametrize("name", SCRIPTS[:2])
def test_help_prints_usage(name):
    result = run_script(name, "--help")
    assert result.returncode == 0 and result.stdout.startswith("Usage:")


def test_tpu_pod_needs_name_and_zone():
    result = run_script("tpu_pod.sh", TPU_ZONE="z")
    assert result.returncode == 2 and "set TPU_NAME" in result.stderr and "Usage:" in result.stderr


def test_tpu_pod_syncs_installs_and_runs_on_every_worker():
    result = run_script(
        "tpu_pod.sh",
        "--",
        "--config=experiments/configs/grpo_hle.py:qwen3_8b",
        "--config.note=a b",
        TPU_NAME="pod",
        TPU_ZONE="us-east5-a",
        TPU_PROJECT="proj",
    )
    assert result.returncode == 0, result.stderr
    scp, unpack, install, job = commands(result)
    assert scp.startswith("+ gcloud compute tpus tpu-vm scp ") and "--worker=all" in scp
    assert all(
        "--worker=all" in c and "--zone=us-east5-a --project=proj" in c
        for c in (unpack, install, job)
    )
    assert "tar\\ -xzf" in unpack and ".\\[tpu\\]" in install
    # The job's flags survive two rounds of quoting (local shell, remote shell).
    assert "ORCHESTRA_JAX_DISTRIBUTED=1\\ python3\\ -m\\ experiments.grpo_hle" in job
    assert "--config.note=a\\\\\\ b" in job
    # A TPU VM runs no SGLang server: rollouts on the TPUs unless servers are named.
    assert job.endswith("--config.rollout.engine=jax")


def test_tpu_pod_shares_remote_sglang_servers():
    env = dict(TPU_NAME="pod", TPU_ZONE="z", SGLANG_URLS="http://gpu-1:30000")
    result = run_script("tpu_pod.sh", "--no-sync", "--no-install", "--config=c.py:demo", **env)
    assert result.returncode == 2 and "SGLANG_WEIGHTS_DIR" in result.stderr
    env["SGLANG_WEIGHTS_DIR"] = "/mnt/shared/w"
    result = run_script("tpu_pod.sh", "--no-sync", "--no-install", "--config=c.py:demo", **env)
    [job] = commands(result)
    assert job.endswith(
        "--config.rollout.engine=sglang\\ --config.rollout.urls=http://gpu-1:30000\\ "
        "--config.rollout.weights_dir=/mnt/shared/w"
    )


def test_tpu_pod_detach_skips_sync_and_install():
    result = run_script(
        "tpu_pod.sh",
        "--no-sync",
        "--no-install",
        "--detach",
        "--config=c.py:demo",
        TPU_NAME="pod",
        TPU_ZONE="z",
    )
    [job] = commands(result)
    assert "nohup" in job and "logs/" in job and "--config=c.py:demo" in job


def test_gpu_node_points_the_rollout_engine_at_sglang():
    result = run_script(
        "gpu_node.sh",
        "--",
        "--config=c.py:demo",
        LEARNER_GPUS="0,1",
        SGLANG_URLS="http://localhost:30000,http://h:30001",
        SGLANG_WEIGHTS_DIR="/w",
    )
    assert result.returncode == 0, result.stderr
    lines = commands(result)
    assert lines[:2] == [
        "+ wait for http://localhost:30000/health",
        "+ wait for http://h:30001/health",
    ]
    assert lines[-1] == (
        "+ python3 -m experiments.grpo_hle --config=c.py:demo --config.rollout.engine=sglang "
        "--config.rollout.urls=http://localhost:30000\\,http://h:30001 "
        "--config.rollout.weights_dir=/w"
    )
    assert "CUDA_VISIBLE_DEVICES=0,1" in result.stderr


def test_gpu_node_without_servers_runs_the_in_process_engine():
    result = run_script("gpu_node.sh", "--config=c.py:demo")
    assert commands(result) == [
        "+ python3 -m experiments.grpo_hle --config=c.py:demo --config.rollout.engine=jax"
    ]


def test_gpu_node_starts_its_own_servers_on_sglang_gpus():
    env = dict(LEARNER_GPUS="0,1,2,3", SGLANG_GPUS="4,5,6,7", SGLANG_TP="2", SGLANG_MODEL="/m")
    result = run_script("gpu_node.sh", "--config=c.py:demo", SGLANG_WEIGHTS_DIR="/w", **env)
    assert result.returncode == 0, result.stderr
    lines = commands(result)
    assert lines[1:3] == [  # one node: the servers listen on loopback only
        "+ env CUDA_VISIBLE_DEVICES=4\\,5 TP_SIZE=2 HOST=127.0.0.1 launch/sglang_server.sh /m 30000",
        "+ env CUDA_VISIBLE_DEVICES=6\\,7 TP_SIZE=2 HOST=127.0.0.1 launch/sglang_server.sh /m 30001",
    ]
    assert "+ wait for http://127.0.0.1:30001/health" in lines
    assert lines[-1].endswith(
        "--config.rollout.urls=http://127.0.0.1:30000\\,http://127.0.0.1:30001 "
        "--config.rollout.weights_dir=/w"
    )
    del env["SGLANG_MODEL"]
    result = run_script("gpu_node.sh", **env)
    assert result.returncode == 2 and "SGLANG_MODEL" in result.stderr


def test_gpu_node_passes_the_distributed_environment_on():
    env = dict(JAX_COORDINATOR_ADDRESS="n0:12355", JAX_NUM_PROCESSES="2", SLURM_PROCID="1")
    result = run_script("gpu_node.sh", "--config=c.py:demo", **env)
    assert result.returncode == 0 and "process 1 of 2, coordinator n0:12355" in result.stderr
    del env["SLURM_PROCID"]
    result = run_script("gpu_node.sh", **env)
    assert result.returncode == 2 and "JAX_PROCESS_ID" in result.stderr


def test_slurm_runs_gpu_node_on_every_node_as_one_jax_job(tmp_path):
    """A stand-in srun runs each task's command: gpu_node.sh, printing what it would run."""
    (tmp_path / "srun").write_text(
        "#!/usr/bin/env bash\n"
        "n=1; while [[ $1 == --* ]]; do [[ $1 == --ntasks=* ]] && n=${1#--ntasks=}; shift; done\n"
        'for ((i = 0; i < n; i++)); do SLURM_PROCID=$i DRY_RUN=1 "$@" || exit; done\n'
    )
    (tmp_path / "srun").chmod(0o755)
    env = dict(
        SLURM_JOB_NODELIST="gpu-a,gpu-b",
        SGLANG_MODEL="/shared/Qwen3-8B",
        SGLANG_WEIGHTS_DIR="/shared/w",
        SGLANG_TP="2",
        ROLLOUT_API_KEY="k",
        PATH=f"{tmp_path}:{os.environ['PATH']}",
    )
    result = run_script("slurm_gpu.sbatch", "--config=c.py:qwen3_8b", DRY_RUN="0", **env)
    assert result.returncode == 0, result.stderr
    assert "2 nodes, coordinator gpu-a:12355, 4 SGLang servers" in result.stderr
    assert "process 0 of 2" in result.stderr and "process 1 of 2" in result.stderr
    jobs = [line for line in commands(result) if line.startswith("+ python3")]
    assert len(jobs) == 2 and jobs[0] == jobs[1]
    assert "--config.rollout.urls=http://gpu-a:30000\\,http://gpu-a:30001\\," in jobs[0]
    assert "http://gpu-b:30001 --config.rollout.weights_dir=/shared/w" in jobs[0]
    # The other nodes' learners reach each node's servers, which listen beyond loopback.
    assert "HOST=0.0.0.0 launch/sglang_server.sh" in result.stdout
    del env["ROLLOUT_API_KEY"]
    result = run_script("slurm_gpu.sbatch", DRY_RUN="0", **env)
    assert result.returncode == 2 and "ROLLOUT_API_KEY" in result.stderr
    env["ROLLOUT_API_KEY"] = "k"
    del env["SGLANG_WEIGHTS_DIR"]
    result = run_script("slurm_gpu.sbatch", DRY_RUN="0", **env)
    assert result.returncode == 2 and "every node shares" in result.stderr


@pytest.mark.parametrize(
    "env, message",
    [({"LEARNER_GPUS": "a,b"}, "LEARNER_GPUS"), ({"SGLANG_URLS": "localhost:30000"}, "http://")],
)
def test_gpu_node_rejects_bad_settings(env, message):
    result = run_script("gpu_node.sh", **env)
    assert result.returncode == 2 and message in result.stderr


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="shellcheck is not installed")
@pytest.mark.parametrize("name", SCRIPTS)
def test_shellcheck_clean(name):
    # -x follows `source common.sh` (relative to the script's folder, the cwd here).
    result = subprocess.run(["shellcheck", "-x", name], cwd=LAUNCH, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
def test_gpu_node_waits_for_a_live_server_then_runs(tmp_path):
    """Not a dry run: a real /health endpoint, and a stand-in module that records its flags."""
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "health").write_text("ok")
    (tmp_path / "record_flags.py").write_text(
        "import os, pathlib, sys\n"
        "pathlib.Path(sys.argv[-1].split('=', 1)[1], 'argv.txt').write_text(\n"
        "    ' '.join(sys.argv[1:]) + ' ' + os.environ['CUDA_VISIBLE_DEVICES'])\n"
    )
    server = subprocess.Popen(
        ["python3", "-m", "http.server", "0", "--bind", "127.0.0.1"],
        cwd=tmp_path / "site",
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        port = (
            server.stdout.readline().split("port ")[1].split()[0]
        )  # "Serving HTTP on ... port N ..."
        result = run_script(
            "gpu_node.sh",
            "--config=c.py:demo",
            DRY_RUN="0",
            MODULE="record_flags",
            PYTHONPATH=str(tmp_path),
            LEARNER_GPUS="3",
            SGLANG_URLS=f"http://127.0.0.1:{port}",
            SGLANG_WEIGHTS_DIR=str(tmp_path),
        )
    finally:
        server.terminate()
        server.wait()
    assert result.returncode == 0, result.stderr
    assert "is healthy" in result.stderr
    assert (tmp_path / "argv.txt").read_text() == (
        f"--config=c.py:demo --config.rollout.engine=sglang --config.rollout.urls=http://127.0.0.1:{port} "
        f"--config.rollout.weights_dir={tmp_path} 3"
    )
