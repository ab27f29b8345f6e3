"""Qwen3Config: presets, config.json round trip, parameter counts, bad input."""

import json

import jax.numpy as jnp
import pytest

from orchestra_jax.models.qwen3.model import Qwen3Config, count_params


def test_preset_parameter_counts():
    assert count_params(Qwen3Config.preset("qwen3_8b")) == 8_190_735_360
    assert count_params(Qwen3Config.preset("qwen3_0p6b")) == 596_049_920
    assert count_params(Qwen3Config.preset("qwen3_8b", scan_layers=True)) == 8_190_735_360


def test_demo_preset_shape():
    c = Qwen3Config.preset("demo")
    assert (
        c.vocab_size,
        c.hidden_size,
        c.num_hidden_layers,
        c.num_attention_heads,
        c.num_key_value_heads,
        c.head_dim,
        c.intermediate_size,
        c.tie_word_embeddings,
        c.max_position_embeddings,
    ) == (4096, 256, 4, 4, 2, 64, 768, True, 4096)


def test_hf_dict_round_trip(tmp_path):
    c = Qwen3Config.preset("qwen3_8b", dtype=jnp.bfloat16, scan_layers=True)
    hf = c.to_hf_dict()
    assert hf["model_type"] == "qwen3" and "scan_layers" not in hf and "remat" not in hf
    (tmp_path / "config.json").write_text(json.dumps(hf))
    assert Qwen3Config.from_hf(tmp_path) == c.replace(dtype=jnp.float32, scan_layers=False)
    assert Qwen3Config.from_hf(hf, dtype=jnp.bfloat16, scan_layers=True) == c


def test_transformers5_rope_parameters_and_missing_head_dim():
    hf = Qwen3Config.preset("tiny").to_hf_dict()
    del hf["rope_theta"], hf["head_dim"]
    hf["rope_parameters"] = {"rope_type": "default", "rope_theta": 123.0}
    c = Qwen3Config.from_hf(hf)
    assert c.rope_theta == 123.0 and c.head_dim == hf["hidden_size"] // hf["num_attention_heads"]


@pytest.mark.parametrize(
    "change,match",
    [
        ({"model_type": "llama"}, "model_type"),
        ({"attention_bias": True}, "attention_bias"),
        ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "rope_scaling"),
        ({"use_sliding_window": True}, "sliding"),
        ({"num_key_value_heads": 3}, "multiple"),
    ],
)
def test_unsupported_configs_raise(change, match):
    hf = {**Qwen3Config.preset("tiny").to_hf_dict(), **change}
    with pytest.raises(ValueError, match=match):
        Qwen3Config.from_hf(hf)


def test_bad_preset_and_remat_raise():
    with pytest.raises(ValueError, match="preset"):
        Qwen3Config.preset("qwen3_70b")
    with pytest.raises(ValueError, match="remat"):
        Qwen3Config.preset("tiny", remat="some")


def test_eos_list_becomes_hashable_tuple():
    hf = {**Qwen3Config.preset("tiny").to_hf_dict(), "eos_token_id": [2, 3]}
    c = Qwen3Config.from_hf(hf)
    assert c.eos_token_id == (2, 3) and hash(c) == hash(Qwen3Config.from_hf(hf))
    assert c.to_hf_dict()["eos_token_id"] == [2, 3]
