"""Evaluating a policy on inference servers: its weights go to every server first.

An in-process engine samples from the model it was built on. Servers hold
whatever they loaded last, so an evaluation that names a policy (an `hf:`
folder, a checkpoint) must load it there and know it landed before the first
request: `push_policy` writes it under a weight version no server reports,
loads it on every server (`RolloutEngine.update_weights`, which checks each
server's version and its log-probs of the sync probe), asks
every server for its version again, and raises `PolicyNotServed` unless each
reports the new one.
"""

from __future__ import annotations

from typing import Any

from orchestra_jax.rollout.engine import RolloutEngine, ServedEngine


class PolicyNotServed(RuntimeError):
    """A server does not serve the policy to evaluate."""


def fresh_version(versions: dict[str, str | None]) -> int:
    """One more than the largest integer version any server reports (1 if none does)."""
    numbers = [int(v) for v in versions.values() if v is not None and v.strip().isdigit()]
    return max(numbers, default=0) + 1


async def push_policy(engine: RolloutEngine, model_state: Any, *, name: str) -> int | None:
    """Loads `model_state` (a model or its state) on every server of a `ServedEngine`
    under a fresh version and returns it, or raises `PolicyNotServed` naming each server
    that does not report it; None, doing nothing, for an in-process engine."""
    if not isinstance(engine, ServedEngine):
        return None
    version = fresh_version(await engine.weight_versions())
    try:
        await engine.update_weights(model_state, version=version)
    except Exception as e:  # noqa: BLE001 - reported with what was being loaded
        raise PolicyNotServed(
            f"could not load policy {name} on the rollout servers as weight version {version}: {e}"
        ) from e
    served = await engine.weight_versions()
    wrong = {url: v for url, v in served.items() if v != str(version)}
    if wrong:
        raise PolicyNotServed(
            f"policy {name} was pushed as weight version {version}, but "
            + ", ".join(f"{url} serves {v!r}" for url, v in wrong.items())
            + "; refusing to evaluate weights other than the policy's"
        )
    return version
