"""The accelerator benchmark's CPU dry run: every cell runs at tiny shapes and is reported."""

import importlib.util
import json

import pytest

from experiments.benchmarks import accelerator


def test_flops_count_causal_attention_by_hand():
    config = accelerator.learner_model_config(dry=True, layers=2, attention="flash")
    e, d, f, v = config.hidden_size, config.head_dim, config.intermediate_size, config.vocab_size
    h, kv = config.num_attention_heads, config.num_key_value_heads
    weights = 2 * (e * d * (2 * h + 2 * kv) + 3 * e * f) + e * v
    seq = 64
    assert accelerator.train_flops(config, seq) == 6 * seq * weights + 6 * h * seq * seq * d * 2


@pytest.mark.slow
def test_dry_run_reports_every_cell(tmp_path):
    payload = accelerator.main(["--dry-run", "--out", str(tmp_path), "--budget-s", "900"])
    written = json.loads((tmp_path / "accelerator.json").read_text())
    assert written["dry_run"] and written["layers"] == payload["layers"] == 2
    learner = written["learner"]
    assert set(learner) == {"flash_64_L2", "xla_64_L2"}, learner
    for cell in learner.values():
        assert "error" not in cell, cell.get("log_tail")
        assert cell["tokens_per_s"] > 0 and cell["plan_total"] > 0 and cell["loss"] is not None
    decode = written["decode"]
    assert "error" not in decode["jax"], decode["jax"].get("log_tail")
    if importlib.util.find_spec("torch") is not None:
        assert "error" not in decode["hf"], decode["hf"].get("log_tail")
        assert set(written["decode_ratio_jax_over_hf"]) == {"b2"}
    else:  # Python 3.12+ in CI has no PyTorch (README, "Tested combinations"): the cell says so
        assert "No module named 'torch'" in decode["hf"]["log_tail"]
        assert written["decode_ratio_jax_over_hf"] == {}
    assert written["machine"]["cpu_count"] and "commit" in written["code"]
