"""`python -m experiments.reference_diff`: every setting of a config that differs from
the release's recipe (`training/reference_recipe.REFERENCE_SETTINGS`), and why."""

import subprocess
import sys

import pytest

from experiments.configs import grpo_hle
from orchestra_jax.training.reference_recipe import (
    HYPERPARAMETER,
    REFERENCE_SETTINGS,
    SHARED,
    config_value,
    differences,
    report,
)

RECIPE = "experiments/configs/grpo_hle.py:qwen3_8b"


def test_qwen3_8b_differs_from_the_release_nowhere():
    assert differences(grpo_hle.get_config("qwen3_8b")) == []


@pytest.mark.parametrize("setting", REFERENCE_SETTINGS, ids=lambda s: s.field)
def test_one_changed_field_is_named_with_the_releases_value_and_file(setting):
    config = grpo_hle.get_config("qwen3_8b")
    project = config_value(grpo_hle.get_config("qwen3_8b_project"), setting.field)
    other = project if project != setting.value else _another(setting.value)
    section, name = config, setting.field.split(".")
    for part in name[:-1]:
        section = section[part]
    section[name[-1]] = other
    [line] = report(config)
    assert line.startswith(f"{setting.field} = {other!r}")
    assert repr(setting.value) in line and setting.source in line and setting.otherwise in line


def test_the_project_variant_keeps_its_own_choice_on_every_non_hyperparameter():
    differing = {s.field for s, _ in differences(grpo_hle.get_config("qwen3_8b_project"))}
    own = {s.field for s in REFERENCE_SETTINGS if s.otherwise not in (HYPERPARAMETER, SHARED)}
    assert differing == own


def test_the_command_prints_nothing_for_the_recipe_and_the_field_when_changed():
    def run(*overrides):
        args = [sys.executable, "-m", "experiments.reference_diff", f"--config={RECIPE}"]
        out = subprocess.run([*args, *overrides], capture_output=True, text=True, check=True)
        return out.stdout

    assert run() == ""
    changed = run("--config.agent.tool_calls=project").splitlines()
    assert len(changed) == 1 and changed[0].startswith("agent.tool_calls = 'project'")


def _another(value):
    if isinstance(value, bool):
        return not value
    if isinstance(value, (int, float)):
        return value + 1
    return value + "_changed"
