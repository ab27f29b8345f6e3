"""Without tau2 (or its data) the tau2 environment says how to get it; no tau2 needed here."""

import sys

import pytest

from experiments.configs import grpo_hle
from orchestra_jax.config_section import ConfigError
from orchestra_jax.envs.tau2 import setup as tau2_setup
from orchestra_jax.training.experiment_config import validate


def test_a_missing_tau2_names_the_install_line(monkeypatch, tmp_path):
    (tmp_path / "tau2" / "domains").mkdir(parents=True)
    monkeypatch.delenv("TAU2_DATA_DIR", raising=False)  # restored after the test
    monkeypatch.setitem(sys.modules, "tau2", None)  # `import tau2` now fails
    with pytest.raises(ImportError, match="--ignore-requires-python ../shared/tau2-bench"):
        tau2_setup.import_tau2(tmp_path)


def test_a_data_folder_is_required_and_checked(monkeypatch, tmp_path):
    monkeypatch.delenv("TAU2_DATA_DIR", raising=False)
    with pytest.raises(ValueError, match="TAU2_DATA_DIR"):
        tau2_setup.import_tau2(None)
    with pytest.raises(ValueError, match="not a τ²-bench data folder"):
        tau2_setup.import_tau2(tmp_path)


def test_the_config_check_says_what_is_missing(monkeypatch, tmp_path):
    monkeypatch.setattr(tau2_setup, "tau2_installed", lambda: False)
    config = grpo_hle.get_config("tau2_demo")
    config.env.tau2.data_dir = str(tmp_path)
    config.env.tau2.user = "simulator"
    config.env.tau2.user_url = ""
    config.env.tau2.nl_assertions = "judge"
    with pytest.raises(ConfigError) as e:
        validate(config)
    message = str(e.value)
    assert "needs tau2" in message and "pip install --no-deps" in message
    assert "is not a τ²-bench data folder" in message
    assert "needs env.tau2.user_url and user_model" in message
    assert "needs env.tau2.judge_url and judge_model" in message
