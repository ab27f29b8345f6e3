"""Orbax checkpoints: bitwise round trips (unsharded and on an 8-device mesh),
exact data resume, keep-N retention, and resuming after an interrupted run."""

import functools
import os
import signal
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from orchestra_jax.data.pipeline import WeightedSource, task_iterator
from orchestra_jax.tasks import Task
from orchestra_jax.training.checkpointing import Checkpointer

CONFIG = {"lr": 1e-6, "group_size": 8, "model": {"preset": "tiny"}, "sources": ["frames", "hle"]}


class TinyMLP(nnx.Module):
    """With `sharded`, kernels split their output axis over "fsdp" (needs a mesh)."""

    def __init__(self, *, sharded, rngs):
        init = nnx.initializers.lecun_normal()
        if sharded:
            init = nnx.with_partitioning(init, (None, "fsdp"))
        self.up = nnx.Linear(4, 16, kernel_init=init, rngs=rngs)
        self.down = nnx.Linear(16, 8, kernel_init=init, rngs=rngs)

    def __call__(self, x):
        return self.down(jax.nn.relu(self.up(x)))


@functools.cache
def trained_state(sharded=False):
    """Params and optimizer state after one AdamW step (so moments are non-zero).

    Built in one jit (one compile instead of one per eager op) and cached: the
    tests only read it. `sharded` builds it on a (data 2, fsdp 4) mesh.
    """
    tx = optax.adamw(1e-2)

    @jax.jit
    def build():
        model = TinyMLP(sharded=sharded, rngs=nnx.Rngs(0))
        graphdef, params = nnx.split(model, nnx.Param)
        opt_state = tx.init(params)
        grads = jax.grad(lambda p: jnp.mean(nnx.merge(graphdef, p)(jnp.ones((2, 4))) ** 2))(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state

    if not sharded:
        return build()
    with jax.set_mesh(MESH()):
        return build()


@functools.cache
def MESH():  # pylint: disable=invalid-name
    assert jax.device_count() == 8, "conftest fakes 8 CPU devices"
    return jax.make_mesh((2, 4), ("data", "fsdp"))


def data_iterator():
    tasks = [Task(id=str(i), question="q", answer="a") for i in range(10)]
    return task_iterator(
        [WeightedSource("t", tasks)], tasks_per_step=3, seed=0, shard_index=0, shard_count=1
    )


def abstract(tree):
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), tree)


def assert_bitwise_equal(a, b):
    assert jax.tree.structure(a) == jax.tree.structure(b)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        assert x.dtype == y.dtype and x.shape == y.shape
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def save_and_restore(tmp_path, params, opt_state, targets):
    rng = jax.random.key(42)
    it = data_iterator()
    for _ in range(2):
        next(it)
    with Checkpointer(tmp_path / "ckpt") as ckpt:
        assert ckpt.save(
            7,
            params=params,
            opt_state=opt_state,
            rng={"sample": rng},
            data_state=it.get_state(),
            config=CONFIG,
        )
    expected_next = [t.id for t in next(it)]
    with Checkpointer(tmp_path / "ckpt") as ckpt:  # a fresh manager, as after a restart
        restored = ckpt.restore(params=targets[0], opt_state=targets[1], rng={"sample": rng})
    assert restored.step == 7 and restored.config == CONFIG
    assert_bitwise_equal(restored.params, params)
    assert_bitwise_equal(restored.opt_state, opt_state)
    assert jax.dtypes.issubdtype(restored.rng["sample"].dtype, jax.dtypes.prng_key)
    np.testing.assert_array_equal(
        jax.random.key_data(restored.rng["sample"]), jax.random.key_data(rng)
    )
    resumed = data_iterator()
    resumed.set_state(restored.data_state)
    assert [t.id for t in next(resumed)] == expected_next
    return restored


def test_round_trip_unsharded(tmp_path):
    params, opt_state = trained_state()
    restored = save_and_restore(
        tmp_path, params, opt_state, (abstract(params), abstract(opt_state))
    )
    assert isinstance(restored.params, nnx.State)
    assert isinstance(restored.opt_state[0], optax.ScaleByAdamState)


def test_round_trip_sharded_on_mesh_keeps_target_shardings(tmp_path):
    params, opt_state = trained_state(sharded=True)
    kernel = params["up"]["kernel"][...]
    assert kernel.sharding.spec == jax.sharding.PartitionSpec(None, "fsdp")
    targets = (abstract(params), abstract(opt_state))
    restored = save_and_restore(tmp_path, params, opt_state, targets)
    for got, want in zip(jax.tree.leaves(restored.params), jax.tree.leaves(targets[0])):
        assert got.sharding == want.sharding


def test_restore_reshards_to_a_different_layout(tmp_path):
    params, opt_state = trained_state(sharded=True)
    with Checkpointer(tmp_path) as ckpt:
        ckpt.save(1, params=params, opt_state=opt_state, rng=jnp.zeros(2, jnp.uint32))
    # Read back onto an 8-way split of the output axis of a 1-D mesh.
    mesh8 = jax.make_mesh((8,), ("fsdp",))
    resharded = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(
            x.shape,
            x.dtype,
            sharding=jax.NamedSharding(mesh8, jax.sharding.PartitionSpec(*x.sharding.spec)),
        ),
        params,
    )
    with Checkpointer(tmp_path) as ckpt:
        restored = ckpt.restore(1, params=resharded)
    assert_bitwise_equal(restored.params, params)
    assert restored.params["up"]["kernel"][...].sharding.mesh.shape == {"fsdp": 8}
    assert restored.data_state is None and restored.config is None


def test_keep_n_retention(tmp_path):
    params, opt_state = trained_state()
    with Checkpointer(tmp_path, max_to_keep=2) as ckpt:
        for step in range(1, 5):
            ckpt.save(step, params=params, opt_state=opt_state, rng=jnp.arange(2, dtype=jnp.uint32))
        ckpt.wait_until_finished()
        assert ckpt.all_steps() == [3, 4]
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.isdigit()) == ["3", "4"]


def test_save_interval_and_force(tmp_path):
    params, opt_state = trained_state()
    with Checkpointer(tmp_path, save_interval_steps=2) as ckpt:
        assert not ckpt.save(1, params=params, opt_state=opt_state, rng=0)
        assert ckpt.save(2, params=params, opt_state=opt_state, rng=0)
        assert ckpt.save(3, params=params, opt_state=opt_state, rng=0, force=True)
        ckpt.wait_until_finished()
        assert ckpt.all_steps() == [2, 3]


def test_resume_after_interrupted_run(tmp_path):
    params, opt_state = trained_state()
    later_params = jax.tree.map(lambda x: x + 1, params)
    # The "crashed" run: saves 1 and 2 and is never closed.
    crashed = Checkpointer(tmp_path)
    crashed.save(1, params=params, opt_state=opt_state, rng=0, config=CONFIG)
    crashed.save(2, params=later_params, opt_state=opt_state, rng=1, config=CONFIG)
    crashed.wait_until_finished()
    # A SIGKILL during the save of step 3 leaves Orbax's unfinished temporary folder.
    torn = tmp_path / "3.orbax-checkpoint-tmp-1700000000"
    (torn / "params").mkdir(parents=True)
    (torn / "params" / "partial").write_bytes(b"\0" * 10)
    restarted = Checkpointer(tmp_path)
    assert restarted.latest_step() == 2 and restarted.all_steps() == [1, 2]
    restored = restarted.restore(params=abstract(params), opt_state=abstract(opt_state))
    assert restored.step == 2 and int(restored.rng) == 1 and restored.config == CONFIG
    assert_bitwise_equal(restored.params, later_params)
    # The resumed run saves step 3 over the torn attempt.
    restarted.save(3, params=later_params, opt_state=opt_state, rng=2)
    restarted.wait_until_finished()
    assert restarted.latest_step() == 3
    restarted.close()
    crashed.close()


def test_missing_checkpoints_and_bad_values_raise_clearly(tmp_path):
    params, opt_state = trained_state()
    with Checkpointer(tmp_path) as ckpt:
        assert ckpt.latest_step() is None
        with pytest.raises(FileNotFoundError, match="no checkpoint"):
            ckpt.restore()
        with pytest.raises(TypeError, match="config must be JSON"):
            ckpt.save(1, params=params, opt_state=opt_state, rng=0, config={"bad": object()})
        ckpt.save(1, params=params, opt_state=opt_state, rng=0)
        with pytest.raises(ValueError, match="already checkpointed"):
            ckpt.save(1, params=params, opt_state=opt_state, rng=0)
        with pytest.raises(FileNotFoundError, match="step 5"):
            ckpt.restore(5)
    with pytest.raises(ValueError, match="max_to_keep"):
        Checkpointer(tmp_path, max_to_keep=0)


# Saves params = step for steps 1, 2, 3, … and reports each committed step.
_SAVER = """
import sys
import jax.numpy as jnp
from orchestra_jax.training.checkpointing import Checkpointer
ckpt = Checkpointer(sys.argv[1], max_to_keep=2)
step = 0
while True:
  step += 1
  params = {"w": jnp.full((256, 256), step, jnp.float32)}
  ckpt.save(step, params=params, opt_state={"mu": params["w"] * 0}, rng=step,
            data_state={"next_index": step})
  if step > 1:
    ckpt.wait_until_finished()
    print("committed", step, flush=True)
"""


def test_sigkill_mid_run_resumes_from_the_last_committed_step(tmp_path):
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="")
    proc = subprocess.Popen(
        [sys.executable, "-c", _SAVER, str(tmp_path)], stdout=subprocess.PIPE, env=env, text=True
    )
    try:
        for line in proc.stdout:
            if line.split() == ["committed", "3"]:
                break
        proc.send_signal(signal.SIGKILL)  # likely while step 4 or 5 is being written
    finally:
        proc.kill()
        proc.wait()
    with Checkpointer(tmp_path) as ckpt:
        step = ckpt.latest_step()
        assert step >= 3 and len(ckpt.all_steps()) <= 2
        restored = ckpt.restore()
    assert (
        restored.step == step
        and restored.rng == step
        and restored.data_state == {"next_index": step}
    )
    np.testing.assert_array_equal(
        np.asarray(restored.params["w"]), np.full((256, 256), step, np.float32)
    )


def test_nnx_optimizer_and_rngs_state_with_abstract_targets(tmp_path):
    model = nnx.Linear(2, 3, rngs=nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param)
    rngs = nnx.Rngs(5)
    rngs()  # advance the stream so its count is not the initial one
    with Checkpointer(tmp_path) as ckpt:
        ckpt.save(
            1,
            params=nnx.state(model, nnx.Param),
            opt_state=nnx.state(optimizer),
            rng=nnx.state(rngs),
        )
    targets = [nnx.state(nnx.eval_shape(lambda x=x: x)) for x in (optimizer, rngs)]
    with Checkpointer(tmp_path) as ckpt:
        restored = ckpt.restore(
            params=abstract(nnx.state(model, nnx.Param)), opt_state=targets[0], rng=targets[1]
        )
    assert_bitwise_equal(restored.opt_state, nnx.state(optimizer))
    expected_next = rngs()
    fresh = nnx.Rngs(0)
    nnx.update(fresh, restored.rng)  # typed key re-wrapped from its data
    np.testing.assert_array_equal(jax.random.key_data(fresh()), jax.random.key_data(expected_next))
