"""A gs:// workdir (fake-gcs-server, tests/gcs_emulator.py): checkpoints, warm-start
parameters, metrics with their resume, TensorBoard events, the judge cache,
trajectories and their viewer page, the evaluation report and HF folders land in
the bucket and are read back from it, with nothing written under the current
directory."""

import json
import os
import uuid

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from orchestra_jax.agent.trajectory import Trajectory, read_jsonl, write_jsonl
from orchestra_jax.agent.view import write_viewer
from orchestra_jax.eval.report import write_report
from orchestra_jax.io import paths
from orchestra_jax.models import safetensors_stream as st
from orchestra_jax.models.hf_checkpoint import (
    load_hf_checkpoint,
    prune_versions,
    save_hf_checkpoint,
)
from orchestra_jax.models.qwen3.model import Qwen3Config, Qwen3ForCausalLM
from orchestra_jax.rewards import judge as judge_lib
from orchestra_jax.rollout.server.app import load_model
from orchestra_jax.training.checkpointing import Checkpointer, restore_params, save_params
from orchestra_jax.training.metrics import MetricsWriter, read_metrics


@pytest.fixture
def workdir(gcs_bucket, tmp_path, monkeypatch) -> str:
    """A fresh gs:// workdir; the test runs in an empty local folder, which must stay
    empty (no `./gs:` folder)."""
    monkeypatch.chdir(tmp_path)
    yield f"{gcs_bucket}/{uuid.uuid4().hex[:8]}"
    assert os.listdir(tmp_path) == []


def _state():
    params = {"dense": {"kernel": jnp.arange(12.0).reshape(3, 4), "bias": jnp.ones(4)}}
    opt_state = {"mu": jnp.full((3, 4), 0.5), "count": jnp.array(7, jnp.int32)}
    return params, opt_state


def test_checkpoints_save_and_restore_in_the_bucket(workdir):
    params, opt_state = _state()
    directory = paths.join(workdir, "checkpoints")
    with Checkpointer(directory, max_to_keep=2) as ckpt:
        assert ckpt.directory == directory
        for step in (1, 2, 3):
            ckpt.save(
                step,
                params=jax.tree.map(lambda x, s=step: x * s, params),
                opt_state=opt_state,
                rng=jax.random.key(step),
                data_state={"position": step},
                config={"lr": 0.1},
            )
    # A fresh process's view: the bucket alone.
    with Checkpointer(directory) as ckpt:
        assert ckpt.all_steps() == [2, 3]
        restored = ckpt.restore(params=params, opt_state=opt_state, rng=jax.random.key(0))
    assert restored.step == 3 and restored.data_state == {"position": 3}
    assert restored.config == {"lr": 0.1}
    for want, got in zip(jax.tree.leaves(jax.tree.map(lambda x: x * 3, params)),
                         jax.tree.leaves(restored.params)):  # fmt: skip
        np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(
        jax.random.key_data(restored.rng), jax.random.key_data(jax.random.key(3))
    )
    names = {p.name for p in paths.as_path(directory).iterdir()}
    assert names == {"2", "3"}

    warm = paths.join(workdir, "warm_start_params")
    save_params(warm, params)
    back = restore_params(warm, params)
    np.testing.assert_array_equal(back["dense"]["kernel"], params["dense"]["kernel"])


def test_metrics_resume_and_tensorboard_in_the_bucket(workdir):
    with MetricsWriter(workdir, total_steps=10, console=False) as writer:
        for step in range(1, 6):
            writer.write(step, {"reward": step})
            # Uploaded after every step: a reader sees it before the writer closes.
            assert read_metrics(paths.join(workdir, "metrics.jsonl"))[-1]["step"] == step
    events = list((paths.as_path(workdir) / "tensorboard").iterdir())
    assert len(events) == 1 and events[0].name.startswith("events.out.tfevents")
    assert events[0].stat().length > 0
    # Resumed from the checkpoint of step 3 (steps 4 and 5 are dropped), by a writer
    # that has never seen the bucket's file on a local disk.
    with MetricsWriter(workdir, total_steps=10, console=False, resume_step=3) as writer:
        writer.write(4, {"reward": 40})
    records = read_metrics(paths.join(workdir, "metrics.jsonl"))
    assert [(r["step"], r["reward"]) for r in records] == [(1, 1), (2, 2), (3, 3), (4, 40)]
    assert len(list((paths.as_path(workdir) / "tensorboard").iterdir())) == 2


def test_judge_cache_in_the_bucket(workdir):
    path = paths.join(workdir, "judge_cache.jsonl")
    other = paths.join(workdir, "judge_cache.host1.jsonl")
    judge = judge_lib.LLMJudge(None, judge_lib.JudgeCache(path))
    key = judge.cache_key("question", "prediction", "reference")
    judge.cache[key] = True  # as grading a new answer does  # pyright: ignore
    assert not paths.as_path(path).exists()  # on an object store: uploaded on flush
    judge.flush()  # the loop flushes after every step
    assert judge_lib.JudgeCache(path) == {key: True}
    # Another host's verdicts, in its own file, are read too.
    other_cache = judge_lib.JudgeCache(other)
    other_cache["k2"] = False
    other_cache.flush()
    resumed = judge_lib.JudgeCache(path, also_read=[other])
    assert resumed == {key: True, "k2": False}


def test_trajectories_report_and_hf_folders_in_the_bucket(workdir):
    traj = Trajectory(
        task_id="t1",
        group_index=0,
        seed=0,
        token_ids=[1, 2, 3],
        loss_mask=[0, 0, 1],
        rollout_logprobs=[0.0, 0.0, -0.5],
        prompt_length=2,
    )
    path = paths.join(workdir, "trajectories", "step_000001.jsonl")
    write_jsonl(path, [traj, traj])
    assert [t.task_id for t in read_jsonl(path)] == ["t1", "t1"]
    page = write_viewer(workdir)
    assert os.fspath(page) == paths.join(workdir, "viewer.html") and "t1" in page.read_text()

    summary = {"policy": "p", "accuracy": 0.5, "mean_cost_usd": 0.01, "mean_latency_s": 1.0,
               "heldout_reward": 0.4, "preference_score": 0.3, "num_tasks": 2}  # fmt: skip
    paths.write_text_atomic(paths.join(workdir, "eval_p.json"), json.dumps(summary))
    md, png = write_report(workdir)
    assert "| p |" in paths.as_path(md).read_text().replace("**", "")
    assert paths.as_path(png).read_bytes().startswith(b"\x89PNG")

    config = Qwen3Config.preset("tiny")
    model = Qwen3ForCausalLM(config, rngs=nnx.Rngs(0))
    weights = paths.join(workdir, "weights")
    for version in (1, 2, 3):
        save_hf_checkpoint(
            model, config, paths.join(weights, f"v{version}"), max_shard_size=200_000
        )
    assert sorted(p.name for p in prune_versions(weights, keep=2)) == ["v1"]
    assert sorted(p.name for p in paths.as_path(weights).iterdir()) == ["v2", "v3"]
    # The rollout server's weight loader (/update_weights_from_disk) reads it too.
    assert isinstance(load_model(paths.join(weights, "v3"), like=config), Qwen3ForCausalLM)
    loaded, loaded_config = load_hf_checkpoint(paths.join(weights, "v3"))
    assert loaded_config.to_hf_dict() == config.to_hf_dict()
    assert len(st.index_checkpoint(paths.join(weights, "v3"))) > 0
    want = nnx.state(model, nnx.Param)
    got = nnx.state(loaded, nnx.Param)
    for a, b in zip(jax.tree.leaves(want), jax.tree.leaves(got)):
        np.testing.assert_array_equal(np.asarray(b), np.asarray(a))
