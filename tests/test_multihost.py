"""A 2-host x 4-device job (launch/local_hosts.py) trains as 1 host x 8 devices does.

The `micro` variant: each host plays one of the step's two tasks on its own copy
of the policy, the hosts exchange trajectories and build the same batch, the
learner's step spans both hosts' devices, Orbax checkpoints are written by both,
and only process 0 writes metrics and trajectories. The job is killed after its
first step (its checkpoint written) and resumed; its parameters then equal a
single 8-device host's to float tolerance (the hosts' reductions run over Gloo in
another order than one process's).

The killed and resumed job's workdir is a gs:// bucket (fake-gcs-server,
tests/gcs_emulator.py) where the emulator is installed, as on a TPU pod: each of
its two launches runs in a fresh, empty local folder, which stays empty, so the
resume reads everything from the bucket. Without the emulator it is a local
folder (the test's id says which).
"""

import json
import os
import pathlib
import signal
import subprocess
import sys

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

from orchestra_jax.io import paths
from orchestra_jax.training.checkpointing import Checkpointer
from tests import gcs_emulator

WORKER = pathlib.Path(__file__).with_name("resume_worker.py")
ROOT = WORKER.parents[1]
STEPS = 2


def _run(workdir, *, hosts, kill_after=None, max_staleness=0, steps=STEPS, turns=False, cwd=ROOT):
    worker = [sys.executable, str(WORKER), str(workdir), str(steps)]
    worker += [] if kill_after is None else [str(kill_after), "saved"]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu"}
    env["RESUME_WORKER_MAX_STALENESS"] = str(max_staleness)
    env["RESUME_WORKER_TURNS"] = "1" if turns else "0"
    if hosts == 1:
        env["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
        command = worker
    else:
        command = [
            sys.executable,
            "-m",
            "launch.local_hosts",
            "--num_hosts",
            str(hosts),
            "--devices_per_host",
            str(8 // hosts),
            "--",
            *worker,
        ]
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=900)


def _params(workdir, like=None):
    """The last checkpoint's parameters as NumPy arrays. A checkpoint written by several
    processes names their devices, so it is read into `like`'s structure on this one's."""
    with Checkpointer(paths.join(workdir, "checkpoints"), async_save=False) as ckpt:
        assert ckpt.latest_step() == STEPS
        if like is None:
            return jax.tree.map(np.asarray, ckpt.restore(STEPS).params)
    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    target = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=device), like)
    with ocp.StandardCheckpointer() as reader:
        restored = reader.restore(
            paths.as_path(paths.join(workdir, "checkpoints", str(STEPS), "params")), target
        )
    return jax.tree.map(np.asarray, restored)


def _metrics(workdir):
    text = paths.as_path(paths.join(workdir, "metrics.jsonl")).read_text()
    return [json.loads(line) for line in text.splitlines()]


# The killed and resumed job's workdir: a bucket in the GCS emulator where it is installed.
MULTI_WORKDIR = "gs" if gcs_emulator.binary() is not None else "local"


@pytest.mark.slow
@pytest.mark.parametrize("kind", [MULTI_WORKDIR])
def test_two_hosts_killed_and_resumed_equal_one_host(tmp_path, request, kind):
    single = _run(tmp_path / "single", hosts=1)
    assert single.returncode == 0, single.stderr[-3000:]

    multi = str(tmp_path / "multi")
    if kind == "gs":
        multi = request.getfixturevalue("gcs_bucket") + "/runs/multi"
    launches = [tmp_path / "launch_killed", tmp_path / "launch_resumed"]
    for folder in launches:
        folder.mkdir()
    killed = _run(multi, hosts=2, kill_after=1, cwd=launches[0])
    assert killed.returncode == 128 + signal.SIGKILL, killed.stdout[-3000:]
    assert "[launcher] host" in killed.stdout and "stopping the others" in killed.stdout
    resumed = _run(multi, hosts=2, cwd=launches[1])
    assert resumed.returncode == 0, resumed.stdout[-3000:]
    assert "[host 0]" in resumed.stdout and "[host 1]" in resumed.stdout
    assert "resumed from" in resumed.stdout
    # Every file went to the workdir: nothing in the folders the launches ran in.
    assert [list(folder.iterdir()) for folder in launches] == [[], []]

    want = _params(tmp_path / "single")
    got = _params(multi, like=want)
    assert len(jax.tree.leaves(want)) == len(jax.tree.leaves(got)) > 0
    for a, b in zip(jax.tree.leaves(want), jax.tree.leaves(got)):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6)
    # The same episodes, rewards and updates; every step logged once (process 0 alone).
    one, two = _metrics(tmp_path / "single"), _metrics(multi)
    assert [m["step"] for m in two] == list(range(1, STEPS + 1))
    for a, b in zip(one, two):
        assert a["learner/skipped"] == b["learner/skipped"] == 0
        for key in ("reward", "generated_tokens", "learner/batch_rows", "learner/num_loss_tokens"):
            assert a[key] == b[key], key
        # The loss is ~0 (advantages have zero mean per group): compare it absolutely.
        np.testing.assert_allclose(b["learner/loss"], a["learner/loss"], atol=1e-6)
        np.testing.assert_allclose(b["learner/grad_norm"], a["learner/grad_norm"], rtol=1e-5)
    assert sorted(p.name for p in paths.as_path(multi).iterdir()) == sorted(
        p.name for p in (tmp_path / "single").iterdir()
    )
    trajectories = sorted(
        paths.as_path(paths.join(multi, "trajectories")).iterdir(), key=lambda p: p.name
    )
    assert [p.name for p in trajectories] == [f"step_{s:06d}.jsonl" for s in (1, 2)]
    assert all(len(p.read_text().splitlines()) == 4 for p in trajectories)  # 2 tasks x G=2


@pytest.mark.slow
def test_collectives_on_two_hosts(tmp_path):
    """HF export gathered by both hosts and written by process 0 alone (equal to one
    process's export), objects exchanged in process order, batches checked across hosts;
    in the same launch, the warm start (each host playing its share of the
    demonstrations) and the held-out evaluations (each host its share of the tasks):
    parameters equal one host's to float tolerance, evaluation summaries equal one
    host's, and process 0 alone writes the evaluation files."""
    from flax import nnx

    from orchestra_jax.models.hf_checkpoint import load_hf_checkpoint, save_hf_checkpoint
    from orchestra_jax.models.qwen3.model import Qwen3Config, create_sharded_model
    from orchestra_jax.parallel.mesh import make_mesh

    command = [
        sys.executable,
        "-m",
        "launch.local_hosts",
        "--num_hosts",
        "2",
        "--devices_per_host",
        "4",
        "--",
        sys.executable,
        str(WORKER.with_name("multihost_worker.py")),
        str(tmp_path),
    ]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu"}
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:]
    hosts = [json.loads((tmp_path / f"host_{i}.json").read_text()) for i in range(2)]
    assert len(hosts[0]["files"]) == 1 and hosts[1]["files"] == []
    for seen in hosts:
        assert seen["parts"] == [["host 0", {"n": 0}], ["host 1", {"n": 1}]]
        assert "hosts built different batches" in seen["mismatch"]
    # Each host holds its own devices' rows of the one global batch.
    rows = [row for seen in hosts for shard in seen["local_rows"] for row in shard]
    assert sorted(rows) == sorted((np.arange(48).reshape(16, 3) % 100).tolist())

    config = Qwen3Config.preset("tiny")
    single = create_sharded_model(config, make_mesh(fsdp=-1), seed=0)
    save_hf_checkpoint(single, config, tmp_path / "single")
    exported, _ = load_hf_checkpoint(tmp_path / "export")
    want = jax.tree.leaves(nnx.state(single, nnx.Param))
    got = jax.tree.leaves(nnx.state(exported, nnx.Param))
    for a, b in zip(want, got):
        np.testing.assert_array_equal(np.asarray(b), np.asarray(a))

    from tests.multihost_worker import warm_start_and_evaluate

    one_params, one = warm_start_and_evaluate(tmp_path / "one_host")
    two = [json.loads((tmp_path / f"summaries_{i}.json").read_text()) for i in range(2)]
    assert two[0] == two[1]  # every host holds the whole test's summary
    one = json.loads(json.dumps(one))  # as the hosts wrote theirs
    for policy in ("warm_start", "random"):
        assert two[0][policy]["num_episodes"] == 5
        assert two[0][policy] == one[policy], policy
    with np.load(tmp_path / "run" / "params.npz") as saved:
        two_params = [saved[f"arr_{i}"] for i in range(len(saved.files))]
    assert len(two_params) == len(one_params) > 0
    for a, b in zip(one_params, two_params):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6)
    written = sorted(p.name for p in (tmp_path / "run").iterdir())
    assert "eval_warm_start.json" in written and "eval_random.json" in written
    lines = (tmp_path / "run" / "trajectories" / "eval_random.jsonl").read_text().splitlines()
    assert len(lines) == 5  # written once, by process 0


@pytest.mark.slow
def test_asynchronous_grpo_on_two_hosts(tmp_path):
    """rl.max_staleness=1 on 2 hosts x 4 devices: each host's producer plays its task
    of every step on its own engine, the learner's threads exchange the steps, and
    every step trains on both hosts' groups within the bound."""
    steps = 3
    result = _run(tmp_path, hosts=2, max_staleness=1, steps=steps)
    assert result.returncode == 0, result.stdout[-3000:]
    lines = _metrics(tmp_path)
    assert [m["step"] for m in lines] == list(range(1, steps + 1))
    for m in lines:
        assert m["learner/skipped"] == 0 and m["async/versions_behind_max"] <= 1
    # Every step's trajectories hold both hosts' groups (2 tasks x G=2), written once.
    trajectories = sorted((tmp_path / "trajectories").iterdir())
    assert [p.name for p in trajectories] == [f"step_{s:06d}.jsonl" for s in range(1, steps + 1)]
    assert all(len(p.read_text().splitlines()) == 4 for p in trajectories)


@pytest.mark.slow
def test_turn_samples_on_two_hosts_equal_one_host(tmp_path):
    """agent.context=rebuild, rl.sample_unit=turn, rl.minibatch_size=2: the hosts
    exchange their episodes, cut the same turn samples and make the same
    ⌈N / 2⌉ updates as one 8-device host."""
    single = _run(tmp_path / "single", hosts=1, turns=True)
    assert single.returncode == 0, single.stderr[-3000:]
    multi = _run(tmp_path / "multi", hosts=2, turns=True)
    assert multi.returncode == 0, multi.stdout[-3000:]
    want = _params(tmp_path / "single")
    got = _params(tmp_path / "multi", like=want)
    # Two hosts sum a mini-batch's gradient in another order than one host. Adam divides
    # each gradient by its own running scale, so an element whose gradient is near zero
    # can turn a rounding difference into a few percent of one step (lr = 2e-4 here); the
    # bound is 5 % of a step per element, far below what a wrong sample or update makes.
    for a, b in zip(jax.tree.leaves(want), jax.tree.leaves(got)):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-5)
    one, two = _metrics(tmp_path / "single"), _metrics(tmp_path / "multi")
    assert [m["step"] for m in two] == list(range(1, STEPS + 1))
    for a, b in zip(one, two):
        assert a["learner/skipped"] == b["learner/skipped"] == 0
        assert a["learner/updates"] == b["learner/updates"] == -(-a["learner/samples"] // 2)
        for key in ("reward", "learner/samples", "learner/batch_rows", "learner/num_loss_tokens"):
            assert a[key] == b[key], key
        np.testing.assert_allclose(b["learner/grad_norm"], a["learner/grad_norm"], rtol=1e-5)
