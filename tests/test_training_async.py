"""Asynchronous GRPO (`rl.max_staleness` > 0): the staleness bound, versions per turn,
stale groups, a dying producer restarted, a killed run resumed with every task once."""

import asyncio
import dataclasses
import json
import os

import numpy as np
import pytest

from orchestra_jax.agent.trajectory import Trajectory, Turn, read_jsonl
from orchestra_jax.config_section import ConfigError
from orchestra_jax.rl.config import RLConfig
from orchestra_jax.rollout.config import RolloutConfig
from orchestra_jax.rollout.scripted import ScriptedEngine
from orchestra_jax.training import async_loop, grpo_loop, loop_steps
from orchestra_jax.training.async_loop import (
    RolloutFailure,
    RolloutProducer,
    StepRollouts,
    stale_groups,
    staleness_metrics,
)
from tests.resume_worker import ranked_reward
from tests.test_training_e2e import micro_config


def episode(*versions):
    t = Trajectory("task", 0, 0, [1, 2], [0, 1], [0.0, -1.0], 1)
    t.turns = [Turn("x", 1, "stop", weight_version=v) for v in versions]
    return t


def test_staleness_of_groups_and_turns_by_hand():
    # Learner at version 5, bound 1; group 0 fresh, group 1 has a turn 2 behind,
    # group 2's engine did not say (fallback: the version the step started on, 3).
    trajectories = [episode(4, 5), episode(5), episode(5), episode(3, 4), episode(None), episode()]
    stale = stale_groups(trajectories, 2, learner_version=5, max_staleness=1, fallback=3)
    assert stale.tolist() == [False, True, True]
    metrics = staleness_metrics(trajectories[:4], 5, 3)
    behind = [1, 0, 0, 0, 2, 1]  # every turn of the first four episodes
    assert metrics["async/versions_behind_mean"] == pytest.approx(np.mean(behind))
    assert metrics["async/versions_behind_max"] == 2
    assert metrics["async/straddling_fraction"] == 0.5  # episodes 0 and 3 span two versions


class Steps:
    """A fake `play`: records the engine version each step started on; may fail once."""

    def __init__(self, engine, fail_at=None):
        self.engine, self.fail_at, self.started = engine, fail_at, {}

    async def __call__(self, tasks, step, positions):
        self.started.setdefault(step, []).append(self.engine.weight_version)
        await asyncio.sleep(0.01)
        if step == self.fail_at:
            self.fail_at = None
            raise RuntimeError("rollout worker died")
        return [episode(self.engine.weight_version) for _ in tasks]


def tasks_from(counter):
    def next_tasks():
        counter.append(len(counter))
        return [f"task{len(counter)}"], {"next_index": len(counter)}

    return next_tasks


@pytest.mark.parametrize("k", [1, 2])
def test_producer_stays_within_the_bound_and_hands_over_in_order(k):
    engine = ScriptedEngine([])
    play = Steps(engine)
    producer = RolloutProducer(play, engine, engine_version=0, max_staleness=k)
    producer.start(0, 6, tasks_from([]))
    try:
        for step in range(6):
            item = producer.get(step)
            assert isinstance(item, StepRollouts) and item.step == step
            assert step - item.started_version <= k
            producer.publish(None, step + 1).result()
        assert max(step - v[0] for step, v in play.started.items()) == k  # it did run ahead
        assert engine.weight_versions == [1, 2, 3, 4, 5, 6]
    finally:
        producer.stop()


def test_a_dead_producer_hands_over_its_failure_and_restarts():
    engine = ScriptedEngine([])
    play = Steps(engine, fail_at=2)
    counter = []
    producer = RolloutProducer(play, engine, engine_version=0, max_staleness=1)
    producer.start(0, 4, tasks_from(counter))
    try:
        got = []
        while len(got) < 4:
            item = producer.get(len(got))
            if isinstance(item, RolloutFailure):
                assert item.step == 2 and "died" in str(item.error)
                producer.wait_stopped()
                producer.start(len(got), 4, tasks_from(counter))
                continue
            got.append(item.step)
            producer.publish(None, len(got)).result()
        assert got == [0, 1, 2, 3]
        assert len(play.started[2]) == 2  # step 2's episodes were played again
    finally:
        producer.stop()


def scripted_run(tmp_path, **overrides):
    """A micro run whose rollouts come from a scripted engine (no decoding to compile)."""
    config = micro_config(
        tmp_path,
        **{
            "rl.max_staleness": 1,
            "data.num_train_tasks": 4,
            "data.stratify_by": "",  # plain epochs: each task once, reshuffled each epoch
            "data.stratum_weights": "",
            "log.tensorboard": False,
            **overrides,
        },
    )
    run = loop_steps.setup_run(config)
    run.engine.close()
    run.engine = ScriptedEngine(lambda ids, req: ([17, 18, 19], [-1.0, -1.5, -2.0]))
    run.reward_fn = ranked_reward
    return run


def trained_task_ids(workdir, steps):
    out = []
    for step in range(1, steps + 1):
        trajectories = read_jsonl(os.path.join(workdir, "trajectories", f"step_{step:06d}.jsonl"))
        out.append(sorted({t.task_id for t in trajectories}))
    return out


def metrics_lines(workdir):
    return [json.loads(line) for line in open(os.path.join(workdir, "metrics.jsonl"))]


def test_killed_and_resumed_run_trains_on_every_task_once_per_epoch(tmp_path):
    # 4 tasks, 2 a step: an epoch is 2 steps. Stopped after step 1 with step 2's
    # rollouts in flight; the resumed run regenerates them.
    run = scripted_run(tmp_path, num_steps=4)

    def stop_after_first(step, metrics):
        if step == 1:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        grpo_loop.grpo_train(run, progress=stop_after_first)
    assert [m["step"] for m in metrics_lines(tmp_path)] == [1]
    grpo_loop.grpo_train(scripted_run(tmp_path, num_steps=4))
    lines = metrics_lines(tmp_path)
    assert [m["step"] for m in lines] == [1, 2, 3, 4]
    ids = trained_task_ids(tmp_path, 4)
    for epoch in range(2):
        tasks = ids[2 * epoch] + ids[2 * epoch + 1]
        assert len(tasks) == 4 and len(set(tasks)) == 4, ids
    iterator = loop_steps.train_task_iterator(run.sections)  # what one uninterrupted run reads
    assert ids == [sorted(t.id for t in next(iterator)) for _ in range(4)]
    for line in lines:
        assert line["async/versions_behind_max"] <= 1
        assert line["learner/skipped"] == 0.0


def test_run_survives_a_dying_producer_and_logs_async_metrics(tmp_path, monkeypatch):
    # Two PPO mini-batches a step, through the config (builders) as a run uses them.
    run = scripted_run(tmp_path, num_steps=3, **{"rl.num_minibatches": 2})
    calls = {"n": 0}
    play_step = loop_steps.play_step

    async def flaky(run, tasks, step, positions):
        calls["n"] += 1
        if step == 1 and calls["n"] == 2:
            raise RuntimeError("rollout worker died")
        return await play_step(run, tasks, step, positions)

    monkeypatch.setattr(loop_steps, "play_step", flaky)
    grpo_loop.grpo_train(run)
    lines = metrics_lines(tmp_path)
    assert [m["step"] for m in lines] == [1, 2, 3]
    for key in (
        "async/versions_behind_mean",
        "async/versions_behind_max",
        "async/dropped_fraction",
        "async/learner_idle_s",
        "async/rollout_idle_s",
        "learner/tis_weight_mean",
        "learner/tis_weight_max",
    ):
        assert all(key in line for line in lines), key
    assert max(line["async/versions_behind_max"] for line in lines) == 1  # it overlapped
    assert all(line["learner/updates"] == 2.0 for line in lines)
    assert run.engine.weight_versions[-1] == 3  # the engine ends on the final weights


def test_stale_groups_are_dropped_and_an_empty_step_is_skipped(tmp_path):
    run = scripted_run(tmp_path, num_steps=2, **{"rl.stale_groups": "drop"})

    class Lagging(ScriptedEngine):
        """Reports weights 5 versions older than it holds: every group is stale."""

        def _complete(self, request):
            completion = super()._complete(request)
            completion.weight_version = self.weight_version - 5
            return completion

    run.engine = Lagging(lambda ids, req: ([17, 18], [-1.0, -1.0]))
    grpo_loop.grpo_train(run)
    lines = metrics_lines(tmp_path)
    assert [m["learner/skipped_no_signal"] for m in lines] == [1.0, 1.0]
    assert all(m["async/dropped_fraction"] == 1.0 for m in lines)


def test_sglang_servers_on_several_hosts_are_refused_naming_the_fields(monkeypatch):
    monkeypatch.setattr(async_loop.jax, "process_count", lambda: 2)
    config = micro_config("unused", **{"rl.max_staleness": 1})
    rl = RLConfig.from_config(config.rl)
    async_loop.check_async(rl, RolloutConfig.from_config(config.rollout))  # each host plays
    with config.unlocked():
        config.rollout.engine = "sglang"
    with pytest.raises(async_loop.ConfigError, match="rl.max_staleness.*rollout.engine"):
        async_loop.check_async(rl, RolloutConfig.unchecked(config.rollout))


@pytest.mark.slow
def test_async_run_with_the_jax_engine_served_on_loopback(tmp_path):
    """The rollout engine behind the project's server: weights go over as versioned
    HF folders, and every turn carries the version the server's engine reports."""
    from orchestra_jax.rollout.http.sglang_client import SGLangClient
    from orchestra_jax.rollout.server.app import ServerConfig, load_model, serve_in_thread

    config = micro_config(
        tmp_path, **{"rl.max_staleness": 1, "num_steps": 3, "log.tensorboard": False}
    )
    run = loop_steps.setup_run(config)
    run.reward_fn = ranked_reward
    engine = run.engine  # the in-process JAX engine, now behind the server
    # The server swaps between requests: no partial rollouts.
    rl = dataclasses.replace(run.sections.rl, partial_rollouts=False)
    run.sections = dataclasses.replace(run.sections, rl=rl)
    server_config = ServerConfig(model_path="micro", tokenizer_path="demo")
    try:
        with serve_in_thread(
            engine,
            server_config,
            tokenizer=run.tokenizer,
            weight_loader=lambda path: load_model(path, like=run.model_config),
        ) as server:
            run.engine = SGLangClient(
                server.url, weights_dir=str(tmp_path / "weights"), model_config=run.model_config
            )
            grpo_loop.grpo_train(run)
    finally:
        engine.close()
    lines = metrics_lines(tmp_path)
    assert [m["step"] for m in lines] == [1, 2, 3]
    assert all(m["async/versions_behind_max"] <= 1 for m in lines)
    # The server's own metrics, since the step before (rollout/http/server_pool.py); the
    # producer plays ahead, so a step may log none.
    assert sum(m["rollout/server/0/requests"] for m in lines) > 0, lines
    assert all(m["rollout/server/0/errors"] == 0 and m["rollout/server/0/up"] == 1 for m in lines)
    assert engine.weight_version == 3 and (tmp_path / "weights" / "v3").is_dir()
    trajectories = read_jsonl(os.path.join(tmp_path, "trajectories", "step_000003.jsonl"))
    versions = {turn.weight_version for t in trajectories for turn in t.turns}
    assert versions and versions <= {1, 2}, versions  # step 3 played by versions 2 (or 1)


def test_bad_async_and_minibatch_fields_are_named_at_start_up(tmp_path):
    with pytest.raises(ConfigError) as error:
        micro_config(
            tmp_path,
            **{
                "rl.max_staleness": -1,
                "rl.stale_groups": "keep",
                "rl.num_minibatches": 0,
                "rl.async_wait_timeout_s": 0.0,
            },
        )
    fields = (
        "rl.max_staleness",
        "rl.stale_groups",
        "rl.num_minibatches",
        "rl.async_wait_timeout_s",
    )
    for field in fields:
        assert field in str(error.value)


def test_a_turn_that_straddles_an_update_counts_its_oldest_version():
    # Episode 0's one turn began on version 3 and ended on 5 (a partial rollout).
    straddling = episode(5)
    straddling.turns[0].first_weight_version = 3
    trajectories = [straddling, episode(5)]
    assert stale_groups(
        trajectories, 2, learner_version=5, max_staleness=1, fallback=5
    ).tolist() == [True]
    metrics = staleness_metrics(trajectories, 5, 5)
    assert metrics["async/versions_behind_max"] == 2
    assert metrics["async/partial_turn_fraction"] == 0.5


def test_partial_rollouts_need_the_jax_engine(tmp_path):
    with pytest.raises(ConfigError, match="rl.partial_rollouts"):
        micro_config(tmp_path, **{"rl.max_staleness": 1, "rollout.engine": "sglang"})


class Stalls(Steps):
    """A fake `play` whose step `stall_at` never finishes."""

    def __init__(self, engine, stall_at):
        super().__init__(engine)
        self.stall_at = stall_at

    async def __call__(self, tasks, step, positions):
        if step == self.stall_at:
            await asyncio.Event().wait()
        return await super().__call__(tasks, step, positions)


def test_the_watchdog_names_who_waits_for_whom():
    engine = ScriptedEngine([])
    # The learner never publishes: step 2 waits for version 1 (k = 1).
    producer = RolloutProducer(Steps(engine), engine, engine_version=0, max_staleness=1)
    producer.start(0, 4, tasks_from([]))
    try:
        assert producer.get(0, timeout_s=5).step == 0
        assert producer.get(1, timeout_s=5).step == 1
        with pytest.raises(async_loop.AsyncWaitTimeout) as error:
            producer.get(2, timeout_s=0.3)
        assert str(error.value).startswith("learner waited 0 s for step 2's rollouts")
        assert (
            "producer is waiting for engine version ≥ 1 to start step 2, engine holds 0; "
            "no weight update in flight"
        ) in str(error.value)
    finally:
        producer.stop()
    # An episode that never ends: the learner waits on the step being played.
    producer = RolloutProducer(Stalls(engine, 1), engine, engine_version=0, max_staleness=1)
    producer.start(0, 3, tasks_from([]))
    try:
        assert producer.get(0, timeout_s=5).step == 0
        producer.publish(None, 1).result()
        with pytest.raises(async_loop.AsyncWaitTimeout, match="producer is playing step 1 on"):
            producer.get(1, timeout_s=0.3)
    finally:
        producer.stop()


def test_a_stuck_weight_update_stops_the_run_with_the_watchdogs_error(tmp_path):
    run = scripted_run(tmp_path, num_steps=3, **{"rl.async_wait_timeout_s": 1.0})

    class Stuck(ScriptedEngine):
        """Never finishes loading version 2."""

        async def update_weights(self, params, *, version, **kwargs):
            if version == 2:
                await asyncio.Event().wait()
            await super().update_weights(params, version=version, **kwargs)

    run.engine = Stuck(lambda ids, req: ([17, 18], [-1.0, -1.0]))
    with pytest.raises(async_loop.AsyncWaitTimeout) as error:
        grpo_loop.grpo_train(run)
    message = str(error.value)
    assert "rl.async_wait_timeout_s=1" in message, message
    assert "weight updates to versions [2] sent, not yet applied" in message, message
    assert [m["step"] for m in metrics_lines(tmp_path)] == [1, 2], message


def test_a_cold_start_with_nothing_to_train_runs_to_its_end(tmp_path):
    """Every reward 0 (RL's usual cold start): every group is filtered and no step
    updates, yet each step is a version, so the producer is never held back. The JAX
    engine takes the updates mid-decode (partial rollouts); the watchdog's bound turns
    a hang into a failure (the engine's lost-slot hang itself is pinned down in
    test_rollout_jax_engine_requests.py)."""
    config = micro_config(
        tmp_path,
        **{
            "rl.max_staleness": 1,
            "num_steps": 3,
            "rollout.max_batch_size": 2,  # turns wait for slots: admissions beside updates
            "rl.async_wait_timeout_s": 120.0,  # a hang fails the test
            "log.tensorboard": False,
        },
    )
    run = loop_steps.setup_run(config)
    run.reward_fn = lambda features, correct, preference: np.zeros(len(features), np.float32)
    try:
        grpo_loop.grpo_train(run)
    finally:
        run.engine.close()
    lines = metrics_lines(tmp_path)
    assert [m["step"] for m in lines] == [1, 2, 3]
    assert all(m["learner/skipped_no_signal"] == 1.0 for m in lines)
    assert run.engine.weight_version == 3


def test_each_published_version_is_verified_and_its_metrics_kept():
    class Checked(ScriptedEngine):
        async def update_weights(self, model_state, *, version, abort_in_flight=False):
            if version == 3:
                raise RuntimeError("version 3 did not land")
            await super().update_weights(model_state, version=version)

    engine = Checked([])
    producer = RolloutProducer(
        Steps(engine),
        engine,
        engine_version=0,
        max_staleness=1,
        after_sync=lambda: {"rollout/sync_logprob_max_abs_diff": engine.weight_versions[-1] / 10},
    )
    try:
        producer.publish("w1", 1).result()
        producer.publish("w2", 2).result()
        assert engine.weight_versions == [1, 2]
        assert producer.sync_metrics == {"rollout/sync_logprob_max_abs_diff": 0.2}
        with pytest.raises(RuntimeError, match="did not land"):  # stops the learner
            producer.publish("w3", 3).result()
    finally:
        producer.stop()
