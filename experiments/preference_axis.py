r"""How a run's policies follow the stated preference (the paper's third axis).

  python -m experiments.preference_axis --config=experiments/configs/grpo_hle.py:demo \
      --config.workdir=runs/demo [the run's other --config overrides]

Plays the run's held-out test (the same tasks, tool configurations and episode
seeds as its own evaluation) under the two preference vectors of
`orchestra_jax/eval/preference_axis.py` ("cost_heavy", "accuracy_heavy"), each
task's preference replaced by the vector and stated in the prompt, with the run's
warm start (`<workdir>/warm_start_params`) and its GRPO checkpoint. Writes
`<workdir>/preference_axis/`: `eval_<policy>_<vector>.json` with the episodes,
`preference_axis.json` (the table, each policy's cost saved when asked for low
cost, the verdict) and `preference_axis.md`; prints the Markdown.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import logging
from collections.abc import Sequence
from typing import Any

from absl import flags
from ml_collections import config_flags

from orchestra_jax.training import cli

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "The run's config: path/to/config.py:variant.", lock_config=True
)
_POLICIES = flags.DEFINE_string(
    "policies", "warm_start,checkpoint", "Comma-separated: the start first, then the trained."
)
OUTPUT_DIR = "preference_axis"


def under_preference(evaluator: Any, preference: dict[str, float]) -> Any:
    """A copy of `evaluator` whose every task states `preference` (worded from it)."""
    other = copy.copy(evaluator)
    other.tool_configs = {
        task: dataclasses.replace(c, preference=dict(preference), preference_text=None)
        for task, c in evaluator.tool_configs.items()
    }
    return other


def play_under_vectors(
    config: Any, policies: list[str]
) -> tuple[dict[str, dict[str, list[Any]]], dict[str, Any]]:
    """policy name -> vector name -> graded episodes of the held-out test, and the
    test's tool configurations (task id -> ToolConfig)."""
    from orchestra_jax.agent.trajectory import read_jsonl
    from orchestra_jax.eval.preference_axis import PREFERENCE_VECTORS
    from orchestra_jax.io import paths
    from orchestra_jax.training import builders, experiment, loop_steps
    from orchestra_jax.training.policy_engines import policy_engine

    tokenizer = builders.build_tokenizer(config)
    evaluator = experiment.build_evaluator(config, None, tokenizer, None)
    out = paths.join(loop_steps.workdir_of(config), OUTPUT_DIR)
    episodes: dict[str, dict[str, list[Any]]] = {}
    for policy in policies:
        loaded = policy_engine(copy.deepcopy(config), policy, tokenizer)
        for vector, preference in PREFERENCE_VECTORS.items():
            name = f"{loaded.name}_{vector}"
            experiment.evaluate(
                under_preference(evaluator, preference), name, loaded.engine, workdir=out
            )
            played = read_jsonl(paths.join(out, "trajectories", f"eval_{name}.jsonl"))
            episodes.setdefault(loaded.name, {})[vector] = [
                t for t in played if t.infra_failure is None
            ]
        loaded.engine.close()
    return episodes, evaluator.tool_configs


def run(config: Any, policies: Sequence[str] = ("warm_start", "checkpoint")) -> Any:
    """Plays `policies` (the start, then the trained) under both vectors, writes
    `preference_axis.md` and `.json` into `<workdir>/preference_axis/`, returns the
    `PreferenceAxisReport`."""
    from orchestra_jax.eval import preference_axis
    from orchestra_jax.io import paths
    from orchestra_jax.training import loop_steps

    episodes, tool_configs = play_under_vectors(config, list(policies))
    start, trained = list(episodes)
    report = preference_axis.build_report(
        episodes,
        tool_configs,
        cost_scale=config.eval.cost_scale_usd,
        latency_scale=config.eval.latency_scale_s,
        trained=trained,
        start=start,
    )
    out = paths.join(loop_steps.workdir_of(config), OUTPUT_DIR)
    paths.write_text_atomic(
        paths.join(out, "preference_axis.md"), preference_axis.to_markdown(report)
    )
    paths.write_text_atomic(
        paths.join(out, "preference_axis.json"),
        json.dumps(dataclasses.asdict(report), indent=2, sort_keys=True),
    )
    logging.info("preference axis: %s", paths.join(out, "preference_axis.md"))
    return report


def main(argv):
    del argv
    from orchestra_jax.config_section import split_list
    from orchestra_jax.eval.preference_axis import to_markdown

    config = cli.validated(_CONFIG.value)
    print(to_markdown(run(config, split_list(_POLICIES.value))))


if __name__ == "__main__":
    cli.run(main)
