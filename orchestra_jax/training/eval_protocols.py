"""Evaluation protocols: named sets of evaluation settings, applied in one place.

`eval.protocol` names one (`EVAL_PROTOCOLS`, or "package.module:attr" for a
protocol of one's own). `experiment.build_evaluator` applies it: the config the
test is built from is `protocol.apply(config)` (its `settings`, and its
`tau2_settings` where τ² conversations are played), the tasks' tool
configurations come from its `tool_table` (`evaluation.TOOL_TABLES`) and "judge"
tasks are settled by its `answer_match` (`rewards/judge.ANSWER_MATCHES`) before
the judge is asked. Nothing else in the evaluation knows which protocol runs.

"heldout" (the default): the project's generalisation test. Held-out prices
outside the training ranges with a stated preference per task, the config's own
turns, τ² step budget, trials and `eval.temperature` (greedy by default),
normalised exact match before the judge.

"paper": the reference release's evaluation (`evaluation/eval_hle.py`,
`eval_frames.py`, `tau2-bench/run.py`). The catalogue's models as listed, at
their own prices (`models_paper.yaml` is the release's `evaluation/tools.json`
table, with gpt-5's and gpt-5-mini's input prices as published), no preference
text, orchestrator temperature 1.0 (sampled, seeded by `eval.seed`), 50 rounds,
one trial, the release's tool order, and a lower-case exact match before the
judge; where τ² conversations are played, tau2's 200-step budget (the turn limit
raised to it, so that the budget ends a conversation), the user simulator at
temperature 1.0 and the task's natural-language assertions graded by the judge
of `env.tau2.judge_*` (the release's `EvaluationType.ALL`). A QA run on live experts
must use the release's table: `models_paper.yaml` or a copy that changes only
endpoints, request model ids, keys and request options (`problems`).

docs/reproduction.md ("Evaluation protocol") has the commands for each table.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from typing import Any

from orchestra_jax.config_section import ExperimentConfig
from orchestra_jax.envs.config import EnvConfig
from orchestra_jax.envs.tau2.config import tau2_problems
from orchestra_jax.registry import Registry
from orchestra_jax.rewards.judge import ANSWER_MATCHES
from orchestra_jax.tools import live_backends
from orchestra_jax.tools.config import aliases_from_profiles
from orchestra_jax.tools.enabled import enabled_tools
from orchestra_jax.tools.experts.catalogue import CatalogueError, load_catalogue
from orchestra_jax.training.evaluation import TOOL_TABLES

# The release's evaluation table as a catalogue file, shipped with the experiments
# package beside this one (in a checkout and in an installed wheel alike).
PAPER_CATALOGUE = os.path.join(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
    "experiments",
    "configs",
    "models_paper.yaml",
)


@dataclasses.dataclass(frozen=True)
class EvalProtocol:
    """One named set of evaluation settings (see the module docstring).

    Attributes:
      name: the `eval.protocol` value, recorded in every evaluation summary.
      tool_table: the tasks' tool configurations, an `evaluation.TOOL_TABLES` name.
      answer_match: the exact-match check before the judge, an `ANSWER_MATCHES` name.
      settings: config field -> value, set for the evaluation whatever the run says.
      tau2_settings: likewise, only where τ² conversations are played
        (`env.name` "tau2", or a routed run with a "tau2" member).
      catalogue: a catalogue file whose table a QA run's live tools must reproduce
        (`problems`); "": any catalogue.
    """

    name: str
    tool_table: str
    answer_match: str
    settings: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    tau2_settings: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    catalogue: str = ""

    def apply(self, config: ExperimentConfig) -> ExperimentConfig:
        """A copy of `config` with this protocol's settings; `config` is untouched."""
        settings = dict(self.settings)
        if plays_tau2(config):
            settings.update(self.tau2_settings)
        out = config.copy_and_resolve_references()
        with out.unlocked():
            out.update_from_flattened_dict(settings)
        return out

    def problems(self, config: ExperimentConfig) -> list[str]:
        """One line per reason this protocol cannot evaluate `config`'s runs."""

        errors = [
            f"eval.protocol={self.name!r}: {problem}"
            for problem in (
                TOOL_TABLES.problem(self.tool_table),
                ANSWER_MATCHES.problem(self.answer_match),
            )
            if problem is not None
        ]
        if self.tau2_settings and plays_tau2(config) and _env_names(config) != ["tau2"]:
            errors.append(
                f"eval.protocol={self.name!r} evaluates τ² apart from other environments "
                f"(it sets {_fields(self.tau2_settings)} there); set env.name='tau2' "
                "for the τ² evaluation"
            )
        if self.catalogue and "qa" in _env_names(config):
            errors += _catalogue_problems(self, config)
        if self.tau2_settings and plays_tau2(config):
            known = set(tau2_problems(config.env.tau2))  # the env section reports those
            errors += [
                f"eval.protocol={self.name!r} sets {_fields(self.tau2_settings)}: {problem}"
                for problem in tau2_problems(self.apply(config).env.tau2)
                if problem not in known
            ]
        return errors


def _fields(settings: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in settings.items())


def _env_names(config: ExperimentConfig) -> list[str]:
    return EnvConfig.unchecked(config.env).played()


def plays_tau2(config: ExperimentConfig) -> bool:
    """Whether `config`'s runs play τ² conversations."""
    return "tau2" in _env_names(config)


def _table(catalogue: Any, tools: list[str]) -> list[tuple[str, str, float, float, float]]:
    """(alias, model name, price in, price out, latency) in listed order."""

    profiles = catalogue.profiles(tools)
    ones = [1.0] * len(profiles)
    return [
        (a.alias, a.backend, a.price_in, a.price_out, a.latency_s)
        for a in aliases_from_profiles(profiles, ones, ones)
    ]


def _catalogue_problems(protocol: EvalProtocol, config: ExperimentConfig) -> list[str]:
    """`tools.catalogue` against `protocol.catalogue`, over the live meta-tools."""

    try:
        kinds = live_backends.parse_backends(
            config.tools.backends, enabled_tools(config.tools.enabled)
        )
        live = live_backends.tools_of_kind(kinds, "live")
        if not live:
            return []
        ours = _table(load_catalogue(config.tools.catalogue), live)
        theirs = _table(load_catalogue(protocol.catalogue), live)
    except (ValueError, CatalogueError):
        return []  # the tools section names the tools.* mistake
    if ours == theirs:
        return []
    differ = next(
        (f"{_row(a)}, the table's {_row(b)}" for a, b in zip(ours, theirs) if a != b),
        f"{len(ours)} aliases, the table's {len(theirs)}",
    )
    return [
        f"eval.protocol={protocol.name!r}: tools.catalogue {config.tools.catalogue} is not the "
        f"table of {protocol.catalogue} ({differ}); use that file, or a copy that changes "
        "only base_url, model, api_key_env, extra_body or reasoning_model"
    ]


def _row(row: tuple[str, str, float, float, float]) -> str:
    alias, model, price_in, price_out, latency = row
    return f"{alias} = {model} at ${price_in:g}/${price_out:g} per M, {latency:g}s"


EVAL_PROTOCOLS: Registry[EvalProtocol] = Registry("evaluation protocol")
EVAL_PROTOCOLS.register(
    "heldout", EvalProtocol(name="heldout", tool_table="heldout", answer_match="normalized")
)
EVAL_PROTOCOLS.register(
    "paper",
    EvalProtocol(
        name="paper",
        tool_table="catalogue",
        answer_match="lowercase",
        settings={
            "eval.temperature": 1.0,  # the release's orchestrator calls: temperature=1
            "eval.num_trials": 1,
            "agent.max_turns": 50,  # MAX_ROUNDS, --max_rounds 50
            "tools.description_style": "full",
            "tools.enabled": "enhance_reasoning,answer,search",  # evaluation/tools.json's order
        },
        tau2_settings={
            "env.tau2.max_steps": 200,  # tau2 run --max-steps 200 --num-trials 1
            "agent.max_turns": 200,  # every turn is a step: the step budget ends first
            "env.tau2.user_temperature": 1.0,  # the release's tau2 config: user at 1.0
            "env.tau2.nl_assertions": "judge",  # EvaluationType.ALL: NL assertions judged
        },
        catalogue=PAPER_CATALOGUE,
    ),
)


def eval_protocol(config: ExperimentConfig) -> EvalProtocol:
    """The protocol `eval.protocol` names."""
    return EVAL_PROTOCOLS.get(config.eval.protocol)
