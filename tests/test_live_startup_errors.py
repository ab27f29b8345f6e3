"""Start-up errors of the live setup: each mistake is one line of the config check."""

import json

import pytest
import yaml

from experiments.configs import grpo_hle
from orchestra_jax.config_section import ConfigError
from orchestra_jax.training.experiment_config import validate


def live_config(tmp_path, **catalogue_changes):
    """live_tiny without search (no index to build), on a small FRAMES-format file."""
    config = grpo_hle.get_config("live_tiny")
    config.tools.enabled = "enhance_reasoning,answer"
    rows = [{"id": f"f{i}", "question": f"Q{i}?", "answer": f"A{i}"} for i in range(6)]
    path = tmp_path / "frames.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    config.data.paths.frames = str(path)
    if catalogue_changes:
        catalogue = yaml.safe_load(open(grpo_hle.LOCAL_CATALOGUE))
        for key, value in catalogue_changes.items():
            if value is None:
                del catalogue["models"][0][key]
            else:
                catalogue["models"][0][key] = value
        (tmp_path / "models.yaml").write_text(yaml.safe_dump(catalogue))
        config.tools.catalogue = str(tmp_path / "models.yaml")
    return config


def problems(config) -> list[str]:
    with pytest.raises(ConfigError) as e:
        validate(config)
    return str(e.value).splitlines()[1:]


def only_line(lines, needle):
    hits = [line for line in lines if needle in line]
    assert len(hits) == 1, lines
    return hits[0]


def test_the_live_config_itself_is_valid(tmp_path):
    validate(live_config(tmp_path))


@pytest.mark.parametrize(
    "change, needle",
    [
        ({"price_out": None}, "model #1 'tiny-large': missing field(s) ['price_out']"),
        ({"roles": ["answer", "translator"]}, "unknown role 'translator'"),
        ({"price_in": -0.5}, "'tiny-large': price_in must be >= 0, got -0.5"),
        (
            {"api_key_env": "ORCHESTRA_UNSET_TEST_KEY"},
            "model 'tiny-large' reads its API key from $ORCHESTRA_UNSET_TEST_KEY, which is not set",
        ),
    ],
)
def test_catalogue_mistakes(tmp_path, monkeypatch, change, needle):
    monkeypatch.delenv("ORCHESTRA_UNSET_TEST_KEY", raising=False)
    line = only_line(problems(live_config(tmp_path, **change)), needle)
    assert line.strip().startswith("tools.catalogue:")


def test_simulated_experts_are_refused_with_hle_data(tmp_path):
    config = grpo_hle.get_config("micro")
    config.data.sources = "hle"
    config.data.paths.hle = str(tmp_path / "hle.jsonl")
    line = only_line(problems(config), "read the gold answer")
    assert (
        "tools.backends: the simulated experts of ['search', 'enhance_reasoning', 'answer']" in line
    )
    assert "data.sources has ['hle']" in line
    # One simulated tool is enough to refuse; so is a mixture with synthetic data.
    live = live_config(tmp_path)
    live.tools.backends = "live,answer=offline"
    live.data.sources = "synthetic:1,frames:1"
    assert "simulated experts of ['answer']" in only_line(problems(live), "gold answer")


def test_an_eval_split_that_overlaps_training(tmp_path):
    config = live_config(tmp_path)
    config.data.eval_paths.frames = config.data.paths.frames
    only_line(problems(config), "data.eval_paths.frames is data.paths.frames")


def test_judged_data_without_a_judge_and_live_tools_in_the_synthetic_world(tmp_path):
    config = live_config(tmp_path)
    config.reward.judge.base_url = ""
    only_line(problems(config), "data.sources ['frames'] are graded by an LLM judge")
    synthetic = grpo_hle.get_config("micro")
    synthetic.tools.backends = "live"
    only_line(problems(synthetic), "live needs env.name='qa' (or 'qa' among env.members)")


def test_a_routed_run_whose_default_is_the_synthetic_world_cannot_play_real_data(tmp_path):
    """Tasks that name no environment go to the first member: FRAMES rows would meet
    the synthetic world's simulated experts there, whatever tools.backends says."""
    config = live_config(tmp_path)
    config.env.name = "routed"
    config.env.members = "synthetic,qa"
    line = only_line(problems(config), "read the gold answer")
    assert "the synthetic world (env 'synthetic', which plays those tasks)" in line
    config.env.members = "qa,synthetic"  # FRAMES rows go to the live QA environment
    assert not [p for p in problems_or_none(config) if "gold answer" in p]


def problems_or_none(config) -> list[str]:
    try:
        validate(config)
    except ConfigError as e:
        return str(e).splitlines()[1:]
    return []
