"""Orbax checkpoints of a training run: everything needed to resume exactly.

One `ocp.CheckpointManager` per run directory; each step folder holds five
items of one `ocp.args.Composite`:

    params      model parameters (e.g. `nnx.state(model, nnx.Param)`), arrays
    opt_state   optimizer state (optax state or `nnx.state(optimizer)`), arrays
    rng         RNG state: any pytree of arrays; typed JAX keys are stored as
                their raw key data and re-wrapped on restore
    data        the data iterator's `get_state()` (JSON)
    config      the run's config (JSON; an ml_collections ConfigDict is converted)

`directory` is a local folder or a `gs://` URI (`orchestra_jax/io/paths.py`):
Orbax lays out folders through `epath` and writes arrays through tensorstore,
whose GCS driver writes to the bucket directly. The step is the step folder's name. Saves are asynchronous: `save` returns
once arrays are copied off the devices and writing goes on in the background;
Orbax writes to a temporary folder and renames it when complete (on GCS, which
cannot rename, it writes a `commit_success.txt` last instead), so a run
killed mid-save leaves the previous checkpoint as the latest one.
`max_to_keep` keeps the newest N steps.

Restoring sharded arrays: pass the abstract targets (`jax.ShapeDtypeStruct`
with `.sharding`, or concrete arrays whose shardings are reused), e.g.
`nnx.state(nnx.eval_shape(...))` placed on the mesh; each array is read
straight into its shards. Without targets the arrays come back as saved
(and the pytree node types, like optax's named tuples, are lost).
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp

from orchestra_jax.io import paths

_ARRAY_ITEMS = ("params", "opt_state", "rng")
_JSON_ITEMS = ("data", "config")


@dataclasses.dataclass
class RestoredCheckpoint:
    """Everything one checkpoint holds; `data_state` goes to `iterator.set_state`."""

    step: int
    params: Any
    opt_state: Any
    rng: Any
    data_state: dict | None
    config: dict | None


class Checkpointer:
    """Saves and restores training state under `directory` (see module docstring)."""

    def __init__(
        self,
        directory: str | os.PathLike,
        *,
        max_to_keep: int | None = 3,
        save_interval_steps: int = 1,
        async_save: bool = True,
    ):
        if max_to_keep is not None and max_to_keep < 1:
            raise ValueError(f"max_to_keep must be >= 1 or None (keep all), got {max_to_keep}")
        if save_interval_steps < 0:
            raise ValueError(f"save_interval_steps must be >= 0, got {save_interval_steps}")
        self.directory = os.fspath(paths.as_path(directory))
        self.save_interval_steps = save_interval_steps
        options = ocp.CheckpointManagerOptions(
            max_to_keep=max_to_keep,
            enable_async_checkpointing=async_save,
            create=True,
        )
        self._manager = ocp.CheckpointManager(
            self.directory, item_names=_ARRAY_ITEMS + _JSON_ITEMS, options=options
        )

    # ------------------------------------------------------------------ save

    def save(
        self,
        step: int,
        *,
        params: Any,
        opt_state: Any,
        rng: Any,
        data_state: dict | None = None,
        config: Any = None,
        force: bool = False,
    ) -> bool:
        """Starts saving step `step`; returns whether it did.

        Saves when `step % save_interval_steps == 0` (never with an interval of 0)
        or `force` (e.g. the last step, or on a preemption signal).
        """
        due = self.save_interval_steps > 0 and step % self.save_interval_steps == 0
        if not force and not due:
            return False
        if step in self._manager.all_steps():
            raise ValueError(f"step {step} is already checkpointed in {self.directory}")
        args = ocp.args.Composite(
            params=ocp.args.StandardSave(params),
            opt_state=ocp.args.StandardSave(opt_state),
            # Wrapped: StandardSave takes pytrees, not a bare array or int seed.
            rng=ocp.args.StandardSave({"rng": _keys_to_data(rng)}),
            data=ocp.args.JsonSave(_json_safe(data_state, "data_state")),
            config=ocp.args.JsonSave(_json_safe(_config_dict(config), "config")),
        )
        return self._manager.save(step, args=args, force=True)

    # --------------------------------------------------------------- restore

    def restore(
        self,
        step: int | None = None,
        *,
        params: Any = None,
        opt_state: Any = None,
        rng: Any = None,
    ) -> RestoredCheckpoint:
        """Restores step `step` (default: the latest).

        `params`, `opt_state` and `rng` are optional targets giving structure,
        dtypes and shardings (abstract or concrete; see module docstring).
        """
        if step is None:
            step = self.latest_step()
            if step is None:
                raise FileNotFoundError(f"no checkpoint in {self.directory}")
        elif step not in self._manager.all_steps():
            raise FileNotFoundError(
                f"no checkpoint for step {step} in {self.directory}; have {self.all_steps()}"
            )
        rng_target = None if rng is None else {"rng": _abstract_key_data(rng)}
        restored: Any = self._manager.restore(
            step,
            args=ocp.args.Composite(
                params=_array_restore(params),
                opt_state=_array_restore(opt_state),
                rng=_array_restore(rng_target, already_abstract=True),
                data=ocp.args.JsonRestore(),
                config=ocp.args.JsonRestore(),
            ),
        )
        restored_rng = restored.rng["rng"]
        if rng is not None:
            restored_rng = _data_to_keys(restored_rng, rng)
        return RestoredCheckpoint(
            step=step,
            params=restored.params,
            opt_state=restored.opt_state,
            rng=restored_rng,
            data_state=restored.data,
            config=restored.config,
        )

    # ------------------------------------------------------------ lifecycle

    def latest_step(self) -> int | None:
        """The newest complete checkpoint's step, or None if there is none."""
        return self._manager.latest_step()

    def all_steps(self) -> list[int]:
        return sorted(self._manager.all_steps())

    def wait_until_finished(self) -> None:
        """Blocks until background writes are on disk."""
        self._manager.wait_until_finished()

    def close(self) -> None:
        """Finishes pending writes and releases Orbax's threads."""
        self._manager.close()

    def __enter__(self) -> Checkpointer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# ----------------------------------------------------------------- helpers


def save_params(directory: str | os.PathLike, params: Any) -> None:
    """Writes one parameter tree to `directory` (synchronously; e.g. the warm-start
    policy, which a resumed run needs again as its KL reference)."""
    with ocp.StandardCheckpointer() as checkpointer:
        checkpointer.save(paths.as_path(directory), params, force=True)


def restore_params(directory: str | os.PathLike, like: Any) -> Any:
    """Reads a tree written by `save_params` into `like`'s structure and shardings."""
    with ocp.StandardCheckpointer() as checkpointer:
        return checkpointer.restore(paths.as_path(directory), _abstract(like))


def _abstract(tree: Any) -> Any:
    """Arrays → `ShapeDtypeStruct` with their sharding; abstract leaves pass through."""
    return jax.tree.map(ocp.utils.to_shape_dtype_struct, tree)


def _array_restore(target: Any, *, already_abstract: bool = False) -> ocp.args.StandardRestore:
    if target is None:
        return ocp.args.StandardRestore()
    return ocp.args.StandardRestore(target if already_abstract else _abstract(target))


def _is_typed_key(x: Any) -> bool:
    """True for typed PRNG key arrays and their abstract `ShapeDtypeStruct`s."""
    return hasattr(x, "dtype") and jnp.issubdtype(x.dtype, jax.dtypes.prng_key)


def _keys_to_data(tree: Any) -> Any:
    """Typed PRNG keys → their uint32 key data as host (NumPy) arrays.

    Orbax stores plain arrays only; host arrays because a key lives on one
    device, which on several hosts is not an array Orbax can write (process 0
    writes NumPy values, the same on every host).
    """
    return jax.tree.map(
        lambda x: np.asarray(jax.random.key_data(x)) if _is_typed_key(x) else x, tree
    )


def _abstract_key_data(tree: Any) -> Any:
    """Restore target for `_keys_to_data(tree)`; `tree` may be abstract. Key data comes
    back as NumPy arrays (see `_keys_to_data`)."""

    def leaf(x):
        if _is_typed_key(x):
            data = jax.eval_shape(jax.random.key_data, x)
            return np.zeros(data.shape, data.dtype)
        return ocp.utils.to_shape_dtype_struct(x)

    return jax.tree.map(leaf, tree)


def _data_to_keys(restored: Any, target: Any) -> Any:
    """Re-wraps key data as typed keys wherever the target held a typed key."""

    def rewrap(data, like):
        if _is_typed_key(like):
            # A zero key of the target's dtype names its implementation (threefry, rbg…);
            # works for abstract targets too, which `key_impl` does not accept.
            impl = jax.random.key_impl(jnp.zeros((), like.dtype))
            return jax.random.wrap_key_data(data, impl=impl)
        return data

    return jax.tree.map(rewrap, restored, target)


def _config_dict(config: Any) -> Any:
    # ml_collections.ConfigDict / FrozenConfigDict → plain dict.
    return config.to_dict() if hasattr(config, "to_dict") else config


def _json_safe(value: Any, what: str) -> Any:
    """Round-trips through JSON now, so a bad value fails here, not in a writer thread."""
    try:
        return json.loads(json.dumps(value))
    except (TypeError, ValueError) as e:
        raise TypeError(f"{what} must be JSON-serialisable: {e}") from None
