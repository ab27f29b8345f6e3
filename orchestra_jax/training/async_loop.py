"""Bounded-staleness asynchronous GRPO (`rl.max_staleness` = k > 0).

The rollouts of the next steps are played while the learner trains the current
one, at most k policy versions behind. Version v is the policy after v learner
steps; step s is trained by version s.

Versions count steps, not updates: a step with nothing to train (every group
filtered, as in a cold start whose rewards are all 0) publishes its unchanged
weights as the next version. The bound is then a function of the step counter
alone: each learner step, trained or not, releases exactly one more step of the
producer, so the producer never waits for an update that is not coming, and
"versions behind" is an upper bound on the updates behind (a skipped step moves
no weight, so rollouts from before it are as on-policy as after it).

    rollout producer (a thread, its own event loop)   learner (the calling thread)
    for s = start, start + 1, …:                        for s = start, start + 1, …:
      wait until the engine holds version ≥ s − k         take step s's rollouts (in order)
      tasks = next(data iterator)                         groups more than k versions behind:
      play G episodes a task (concurrently with             regenerated or dropped (rl.stale_groups)
        the steps still in flight)                        score, update (rl/learner.py)
      hand step s over, in step order                     publish version s + 1 to the engine
                                                          checkpoint, metrics

- Every turn records the version of the weights that generated it
  (`Turn.weight_version`, the engine's `Completion.weight_version`); an episode
  whose turns span versions straddles them. With `rl.partial_rollouts` the JAX
  engine takes each update between decode chunks: turns in flight continue on the
  new weights, none is dropped, and such a turn records both versions
  (`Turn.first_weight_version`; the staleness bound counts its oldest); vLLM
  servers freeze the requests in flight while they reload (`/pause?mode=keep`,
  `rollout/http/vllm_client.py`). Without it the engine swaps between requests.
  SGLang servers load versioned folders (`rollout/http/sglang_client.py`) between
  requests. Every update to servers is verified by the client
  (`rollout/http/client.py`: version and sync probe,
  `rollout/sync_logprob_max_abs_diff`). Weight updates run on the
  producer's event loop, in version order, while the learner goes on.
- Off-policy correction: the learner's behaviour log-probs are the engine's, and
  with `rl.tis_cap` the truncated importance weights min(exp(log π_θ − log
  π_rollout), C) correct the version gap (rl/objectives.py).
- Checkpoints hold the data iterator's state after the last trained step's
  tasks, so a resumed run regenerates the rollouts that were in flight: the same
  tasks, tool configurations and seeds, played by the restored policy. Each task
  is trained on once per epoch however often the run is stopped (with
  `rl.stale_groups="drop"`, less the tasks of dropped groups).
- The producer starts a step only once the engine holds a recent enough version,
  so a group goes beyond the bound only where the engine reports older weights
  than it was sent (a server that has not loaded a version yet).
- Metrics per step: async/versions_behind_mean and _max (over the trained turns),
  async/straddling_fraction, async/partial_turn_fraction (turns that straddle an
  update), async/dropped_fraction, async/regenerated_fraction,
  async/learner_idle_s (waiting for rollouts), async/rollout_idle_s (the producer
  waiting on the bound), async/rollout_s; the learner's learner/tis_weight_mean,
  _min, _max and learner/tis_capped_frac.
- A watchdog bounds every wait of the learner on the producer (a step's rollouts,
  a weight update reaching the engine, regenerated groups) by
  `rl.async_wait_timeout_s`: past it the run stops with `AsyncWaitTimeout`,
  whose message names what the learner waited for and where the producer and the
  engine are (e.g. "learner waited 600 s for step 3's rollouts; producer is
  waiting for engine version ≥ 2 to start step 3, engine holds 1; no weight
  update in flight"). The producer's own wait on the bound is not limited: it
  lasts as long as a learner step does.
- A producer that fails (an engine or tool error escaping an episode) hands over
  the failure in the place of its step; the learner restarts it from that step
  (the data iterator's state before it), so its episodes are played again, at most
  `rl.rollout_restarts` times in a row before the run stops with the error.
- Several hosts (with the JAX engine): each host's producer plays its share of
  every step (the tasks its data shard holds, at their places in the step) on its
  host-local engine, and no collective runs on the producer's thread. The learner's
  thread exchanges each step's trajectories (`host_rollouts.gather_step`), makes
  the engines' weight copies and trains, in the same order on every host. With
  `rl.stale_groups="drop"` the step is exchanged first and every host drops the
  same groups; regenerated groups are played by the host that owns them. SGLang
  servers on several hosts are refused at start-up: their weight sync gathers
  across hosts, which would run on the producer's thread.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import logging
import queue
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from orchestra_jax.agent.trajectory import Trajectory
from orchestra_jax.config_section import ConfigError
from orchestra_jax.parallel import multihost
from orchestra_jax.rl.config import RLConfig
from orchestra_jax.rollout.config import RolloutConfig
from orchestra_jax.rollout.engine import RolloutEngine
from orchestra_jax.training import host_rollouts, loop_steps
from orchestra_jax.training.metrics import MetricsWriter
from orchestra_jax.training.rollouts import StepExperience, Timer

log = logging.getLogger(__name__)

STALE_GROUPS = ("regenerate", "drop")  # `rl.stale_groups`

# play(tasks, step, positions) -> graded trajectories, G a task, task by task.
PlayFn = Callable[[Sequence[Any], int, Sequence[int]], Awaitable[list[Trajectory]]]


@dataclasses.dataclass
class StepRollouts:
    """One step's graded episodes, as the producer hands them over."""

    step: int
    tasks: list[Any]
    trajectories: list[Trajectory]
    data_state: Any  # the data iterator's state after this step's tasks
    started_version: int  # the engine's version when the step's episodes started
    seconds: float  # wall time of the step's episodes


@dataclasses.dataclass
class RolloutFailure:
    """The producer died playing step `step`; nothing of that step or later was handed over."""

    step: int
    error: BaseException


class AsyncWaitTimeout(RuntimeError):
    """The learner waited on the rollout producer past `rl.async_wait_timeout_s`; the
    message names what the learner waited for and what the producer and engine were at."""


def turn_versions_behind(trajectory: Trajectory, learner_version: int, fallback: int) -> list[int]:
    """learner_version − v for each turn's oldest weight version v (`fallback` where the
    engine did not say); [learner_version − fallback] for an episode without turns."""
    versions = [
        fallback
        if t.weight_version is None
        else (t.weight_version if t.first_weight_version is None else t.first_weight_version)
        for t in trajectory.turns
    ]
    return [learner_version - v for v in versions or [fallback]]


def stale_groups(
    trajectories: Sequence[Trajectory],
    group_size: int,
    *,
    learner_version: int,
    max_staleness: int,
    fallback: int,
) -> np.ndarray:
    """[groups] bool: the group's oldest turn is more than `max_staleness` versions behind."""
    behind = [max(turn_versions_behind(t, learner_version, fallback)) for t in trajectories]
    return np.asarray(behind).reshape(-1, group_size).max(axis=1) > max_staleness


def staleness_metrics(
    trajectories: Sequence[Trajectory], learner_version: int, fallback: int
) -> dict[str, float]:
    """Versions behind the learner over every trained turn (mean, max) and the fraction
    of episodes whose turns span several versions."""
    behind = [turn_versions_behind(t, learner_version, fallback) for t in trajectories]
    flat = [b for episode in behind for b in episode]
    if not flat:
        return {}
    return {
        "async/versions_behind_mean": float(np.mean(flat)),
        "async/versions_behind_max": float(max(flat)),
        "async/straddling_fraction": float(np.mean([len(set(b)) > 1 for b in behind])),
        "async/partial_turn_fraction": float(
            np.mean([t.first_weight_version is not None for tr in trajectories for t in tr.turns])
        ),
    }


class RolloutProducer:
    """Plays steps' episodes on its own thread and event loop, at most `max_staleness`
    versions ahead of the engine's weights, and hands them over in step order.

    `engine` calls all run on the producer's loop (an HTTP client's session belongs
    to one loop): weight updates are queued there with `publish`.
    """

    def __init__(
        self,
        play: PlayFn,
        engine: RolloutEngine,
        *,
        engine_version: int,
        max_staleness: int,
        partial: bool = False,
        after_sync: Callable[[], dict[str, float]] | None = None,
    ):
        self._play, self._engine, self.max_staleness = play, engine, max_staleness
        self.partial = partial  # updates land while requests are in flight
        # After each weight update: its metrics (loop_steps.sync_report; the engine verifies).
        self._after_sync = after_sync
        self.sync_metrics: dict[str, float] = {}  # the last update's
        self._out: queue.Queue[StepRollouts | RolloutFailure] = queue.Queue()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, daemon=True, name="rollout-producer"
        )
        self._thread.start()
        self._applied = engine_version  # the engine's weights' version
        self._changed = self._call(self._new_condition()).result()
        self._publish_lock = self._call(self._new_lock()).result()
        self._job: concurrent.futures.Future | None = None
        self._failed = False
        # What the producer is at, for the watchdog's messages (written on its loop,
        # read on the learner's thread): the (step, version) it waits for before
        # starting a step, the steps being played, the versions sent but not applied.
        self._waiting: tuple[int, int] | None = None
        self._playing: set[int] = set()
        self._queued: list[int] = []
        self._idle_lock = threading.Lock()
        self._idle_s = 0.0

    @staticmethod
    async def _new_condition() -> asyncio.Condition:
        return asyncio.Condition()

    @staticmethod
    async def _new_lock() -> asyncio.Lock:
        return asyncio.Lock()

    def _call(self, coro) -> concurrent.futures.Future:
        return asyncio.run_coroutine_threadsafe(coro, self._loop)

    @property
    def engine_version(self) -> int:
        return self._applied

    def start(self, first_step: int, num_steps: int, next_tasks: Callable[[], Any]) -> None:
        """Produces steps first_step … num_steps − 1; `next_tasks()` -> (tasks, data state)."""
        if self._job is not None and not self._job.done():
            raise RuntimeError("the rollout producer is already running")
        self._failed = False
        self._job = self._call(self._produce(first_step, num_steps, next_tasks))

    def get(self, step: int, timeout_s: float | None = None) -> StepRollouts | RolloutFailure:
        """Step `step`'s rollouts, the next to be handed over (blocks); a failure if the
        producer died. Waiting past `timeout_s` raises `AsyncWaitTimeout`."""
        start = time.perf_counter()
        poll = 1.0 if timeout_s is None else min(1.0, timeout_s / 4)
        while True:
            try:
                return self._out.get(timeout=poll)
            except queue.Empty:
                job = self._job
                if job is not None and job.done() and self._out.empty():
                    error = job.exception() or RuntimeError("the rollout producer stopped")
                    return RolloutFailure(-1, error)
                waited = time.perf_counter() - start
                if timeout_s is not None and waited > timeout_s:
                    raise AsyncWaitTimeout(
                        f"learner waited {waited:.0f} s for step {step}'s rollouts "
                        f"(rl.async_wait_timeout_s={timeout_s:g}); {self.describe()}"
                    ) from None

    def result(
        self, future: concurrent.futures.Future, what: str, timeout_s: float | None = None
    ) -> Any:
        """`future`'s result (a call queued on the producer's loop); waiting past
        `timeout_s` raises `AsyncWaitTimeout` saying the learner waited for `what`."""
        start = time.perf_counter()
        try:
            return future.result(timeout=timeout_s)
        except concurrent.futures.TimeoutError:
            waited = time.perf_counter() - start
            raise AsyncWaitTimeout(
                f"learner waited {waited:.0f} s for {what} "
                f"(rl.async_wait_timeout_s={timeout_s:g}); {self.describe()}"
            ) from None

    def describe(self) -> str:
        """Where the producer and the engine are, in words (the watchdog's message)."""
        job, waiting, playing = self._job, self._waiting, sorted(self._playing)
        if job is None or job.done():
            parts = ["producer is stopped"]
        elif waiting is not None:
            step, version = waiting
            parts = [
                f"producer is waiting for engine version ≥ {version} to start step {step}, "
                f"engine holds {self._applied}"
            ]
        elif playing:
            steps = ", ".join(str(s) for s in playing)
            parts = [
                f"producer is playing step{'s' * (len(playing) > 1)} {steps} "
                f"on engine version {self._applied}"
            ]
        else:
            parts = [f"producer is handing over steps (engine holds {self._applied})"]
        queued = list(self._queued)
        if queued:
            parts.append(f"weight updates to versions {queued} sent, not yet applied")
        else:
            parts.append("no weight update in flight")
        running = getattr(self._engine, "running", None)
        if callable(running):
            parts.append(f"{running()} requests admitted or waiting in the engine")
        return "; ".join(parts)

    def wait_stopped(self) -> None:
        """Waits until the current job (after a failure: cancelling its steps) has ended."""
        if self._job is not None:
            concurrent.futures.wait([self._job])

    def publish(self, params: Any, version: int) -> concurrent.futures.Future:
        """Queues the engine's update to `params` as `version` (in order of calls)."""
        self._queued.append(version)
        return self._call(self._publish(params, version))

    def play_now(
        self,
        tasks: Sequence[Any],
        step: int,
        positions: Sequence[int],
        timeout_s: float | None = None,
    ) -> list:
        """Plays `tasks` (at `positions` of step `step`) on the engine's current weights."""
        future = self._call(self._play(tasks, step, positions))
        return self.result(future, f"step {step}'s regenerated groups", timeout_s)

    def wait_version(self, version: int, timeout_s: float | None = None) -> None:
        """Blocks until the engine holds `version` or a later one."""
        future = self._call(self._wait_version(version))
        self.result(future, f"the engine to hold version ≥ {version}", timeout_s)

    def take_idle_seconds(self) -> float:
        """Seconds the producer waited on the staleness bound since the last call."""
        with self._idle_lock:
            idle, self._idle_s = self._idle_s, 0.0
        return idle

    def stop(self, timeout_s: float | None = None) -> None:
        """Cancels the steps in flight, finishes queued weight updates, ends the thread.
        A weight update still unfinished after `timeout_s` is left behind on the
        (daemon) thread, said so in the log, so that a stuck engine cannot hide the
        error that stops the run."""
        if self._job is not None:
            self._job.cancel()
            self.wait_stopped()
        if self._thread.is_alive():
            try:
                self._call(self._drain()).result(timeout=timeout_s)
                aclose = getattr(self._engine, "aclose", None)  # an HTTP client's session
                if aclose is not None:
                    self._call(aclose()).result(timeout=timeout_s)
            except concurrent.futures.TimeoutError:
                log.error("rollout producer left running: %s", self.describe())
                return
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join()
        self._loop.close()

    # -- on the producer's loop ----------------------------------------------------------

    async def _drain(self) -> None:
        async with self._publish_lock:  # the weight updates queued before are done
            pass

    async def _publish(self, params: Any, version: int) -> None:
        async with self._publish_lock:
            if self.partial:
                await self._engine.update_weights(params, version=version, partial=True)  # type: ignore[call-arg]
            else:
                await self._engine.update_weights(params, version=version)
            if self._after_sync is not None:
                self.sync_metrics = self._after_sync()
            async with self._changed:
                self._applied = version
                if version in self._queued:
                    self._queued.remove(version)
                self._changed.notify_all()

    async def _wait_version(self, version: int) -> None:
        async with self._changed:
            await self._changed.wait_for(lambda: self._applied >= version or self._failed)

    async def _produce(self, first: int, num_steps: int, next_tasks) -> None:
        order: asyncio.Queue = asyncio.Queue()
        forward = asyncio.create_task(self._forward(order))
        running: list[asyncio.Task] = []
        self._waiting = None
        try:
            for step in range(first, num_steps):
                start = time.perf_counter()
                self._waiting = (step, step - self.max_staleness)
                await self._wait_version(step - self.max_staleness)
                self._waiting = None
                with self._idle_lock:
                    self._idle_s += time.perf_counter() - start
                if self._failed:
                    break
                try:
                    tasks, state = next_tasks()
                except Exception as e:  # noqa: BLE001 - handed over as the step's failure
                    await order.put(RolloutFailure(step, e))
                    break
                play = asyncio.create_task(self._timed_play(tasks, step))
                running.append(play)
                await order.put((step, tasks, state, self._applied, play))
            await order.put(None)
            await forward
        finally:
            self._waiting = None
            for task in [*running, forward]:
                task.cancel()

    async def _timed_play(self, tasks, step: int) -> tuple[list[Trajectory], float]:
        start = time.perf_counter()
        self._playing.add(step)
        try:
            trajectories = await self._play(tasks, step, list(range(len(tasks))))
        finally:
            self._playing.discard(step)
        return trajectories, time.perf_counter() - start

    async def _forward(self, order: asyncio.Queue) -> None:
        """Hands finished steps over in step order; the first failure ends production."""
        while (item := await order.get()) is not None:
            if isinstance(item, RolloutFailure):
                self._fail(item)
                return
            step, tasks, state, version, play = item
            try:
                trajectories, seconds = await play
            except Exception as e:  # noqa: BLE001 - the learner restarts the producer
                self._fail(RolloutFailure(step, e))
                return
            self._out.put(StepRollouts(step, tasks, trajectories, state, version, seconds))

    def _fail(self, failure: RolloutFailure) -> None:
        self._failed = True
        self._out.put(failure)
        self._loop.create_task(self._wake())

    async def _wake(self) -> None:
        async with self._changed:
            self._changed.notify_all()


def check_async(rl: RLConfig, rollout: RolloutConfig) -> None:
    """Start-up checks that need the running job (the config's own are in its sections)."""
    if jax.process_count() > 1 and rollout.engine != "jax":
        raise ConfigError(
            f"rl.max_staleness={rl.max_staleness} with rollout.engine="
            f"{rollout.engine!r} on {jax.process_count()} hosts: asynchronous GRPO "
            "on several hosts needs rollout.engine='jax' (or set rl.max_staleness = 0)"
        )


def async_train(run: loop_steps.Run, *, progress=None, evaluate=None) -> int:
    """GRPO from the last checkpoint to `num_steps` with rollouts overlapping the
    learner (see the module docstring); returns the final step."""
    sections = run.sections
    rl, num_steps = sections.rl, sections.run.num_steps
    check_async(rl, sections.rollout)
    k = rl.max_staleness
    bound = rl.async_wait_timeout_s  # the watchdog: the learner's longest wait
    iterator = loop_steps.train_task_iterator(sections)
    start = loop_steps.restore(run, iterator)
    writer = MetricsWriter(
        run.workdir,
        total_steps=num_steps,
        use_tensorboard=sections.log.tensorboard,
        resume_step=start,
        enabled=multihost.is_primary(),
    )

    # This host's tasks' places in the step (0, 1, … on one host): the producer names
    # tasks by their index in this host's share.
    step_positions = host_rollouts.task_positions(rl.tasks_per_step)

    def play(tasks, step, indices):
        return loop_steps.play_step(run, tasks, step, [step_positions[i] for i in indices])

    def next_tasks():
        tasks = next(iterator)
        return tasks, iterator.get_state()

    producer = RolloutProducer(
        play,
        run.engine,
        engine_version=start,
        max_staleness=k,
        partial=rl.partial_rollouts,
        after_sync=lambda: loop_steps.sync_report(run.engine),
    )
    # The engine plays on its own copy of the weights while the learner's step donates
    # (frees) the buffers it updates, which the model and an in-process engine may share.
    producer.result(producer.publish(_engine_copy(run), start), f"weights version {start}", bound)
    resume_state = iterator.get_state()  # before the next step to train
    producer.start(start, num_steps, next_tasks)
    timer, restarts, publishing = Timer(), 0, None
    step = start
    try:
        while step < num_steps:
            waited = time.perf_counter()
            item = producer.get(step, bound)
            learner_idle = time.perf_counter() - waited
            if isinstance(item, RolloutFailure):
                restarts += 1
                if restarts > rl.rollout_restarts:
                    raise RuntimeError(
                        f"the rollout producer failed {restarts} times in a row at step {step} "
                        f"(rl.rollout_restarts={rl.rollout_restarts})"
                    ) from item.error
                log.warning(
                    "rollout producer died at step %d (%r); restarting it from step %d",
                    item.step,
                    item.error,
                    step,
                )
                producer.wait_stopped()
                iterator.set_state(resume_state)
                producer.start(step, num_steps, next_tasks)
                continue
            if item.step != step:
                raise RuntimeError(f"rollouts of step {item.step} arrived for step {step}")
            restarts = 0
            group_size = rl.group_size
            if rl.stale_groups == "drop":  # every host drops the same groups
                item = dataclasses.replace(
                    item, trajectories=host_rollouts.gather_step(item.trajectories, group_size)
                )
                trajectories, extra = _fresh_groups(run, producer, item, step)
            else:  # each host regenerates its own groups, then the step is exchanged
                trajectories, extra = _fresh_groups(run, producer, item, step)
                trajectories = host_rollouts.gather_step(trajectories, group_size)
            extra.update(staleness_metrics(trajectories, step, item.started_version))
            extra.update(
                {
                    "async/learner_idle_s": learner_idle,
                    "async/rollout_idle_s": producer.take_idle_seconds(),
                    "async/rollout_s": item.seconds,
                    "async/engine_version": float(producer.engine_version),
                    **producer.sync_metrics,
                }
            )
            if trajectories:
                experience = loop_steps.score_step(run, trajectories)
                with timer("learner"):
                    learner_metrics = loop_steps.train_step(run, experience)
            else:  # every group was dropped: nothing to learn from this step
                log.warning("step %d: every group was beyond the staleness bound; skipped", step)
                empty = np.zeros(0, np.float32)
                experience = StepExperience([], empty, empty, np.zeros(0, bool), {})
                learner_metrics = {"learner/skipped_no_signal": 1.0}
            with timer("weight_sync"):
                if publishing is not None:  # a failed weight update stops the run here
                    producer.result(publishing, f"weights version {step}", bound)
                publishing = producer.publish(_engine_copy(run), step + 1)
            if evaluate is not None and sections.eval.every_steps:
                # evaluations see version step + 1
                producer.result(publishing, f"weights version {step + 1}", bound)
            loop_steps.end_step(
                run,
                step,
                experience,
                learner_metrics,
                data_state=item.data_state,
                timer=timer,
                writer=writer,
                evaluate=evaluate,
                extra=extra,
            )
            resume_state = item.data_state
            step += 1
            if progress is not None:
                progress(step, experience.metrics)
        if publishing is not None:  # the engine ends on the final weights
            producer.result(publishing, f"weights version {step}", bound)
    finally:
        producer.stop(bound)
        run.checkpointer.wait_until_finished()
        writer.close()
    return num_steps


def _engine_copy(run: loop_steps.Run) -> Any:
    """The policy's weights as the engine takes them, in buffers of their own."""
    params = host_rollouts.engine_weights(run.learner.policy_params(), run.engine_shardings)
    return jax.tree.map(jnp.copy, params)


def _fresh_groups(
    run: loop_steps.Run, producer: RolloutProducer, item: StepRollouts, step: int
) -> tuple[list[Trajectory], dict[str, float]]:
    """The step's trajectories with groups beyond the staleness bound regenerated on the
    current weights or dropped (`rl.stale_groups`), and how many were."""
    rl = run.sections.rl
    group_size, k = rl.group_size, rl.max_staleness
    trajectories = list(item.trajectories)
    stale = stale_groups(
        trajectories,
        group_size,
        learner_version=step,
        max_staleness=k,
        fallback=item.started_version,
    )
    fraction = float(stale.mean()) if stale.size else 0.0
    dropping = rl.stale_groups == "drop"
    metrics = {
        "async/dropped_fraction": fraction if dropping else 0.0,
        "async/regenerated_fraction": 0.0 if dropping else fraction,
    }
    if not stale.any():
        return trajectories, metrics
    groups = [trajectories[i * group_size : (i + 1) * group_size] for i in range(len(stale))]
    positions = [int(i) for i in np.flatnonzero(stale)]
    if dropping:
        kept = [g for g, s in zip(groups, stale) if not s]
        return [t for g in kept for t in g], metrics
    bound = rl.async_wait_timeout_s
    producer.wait_version(step, bound)  # regenerated by the policy being trained
    again = producer.play_now([item.tasks[i] for i in positions], step, positions, bound)
    for j, i in enumerate(positions):
        groups[i] = again[j * group_size : (j + 1) * group_size]
    return [t for g in groups for t in g], metrics
