"""Qwen3ForCausalLM matches transformers' Qwen3ForCausalLM, and checkpoints round-trip."""

import json

import jax.numpy as jnp
import numpy as np
import pytest
import transformers
from flax import nnx

from orchestra_jax.models.hf_checkpoint import load_hf_checkpoint, save_hf_checkpoint

# PyPI's torch on Python 3.12+ is the CUDA build; CI runs these tests on 3.11 with
# the CPU wheel (README, "Tested combinations").
NO_TORCH = "needs PyTorch (CI: Python 3.11 with the CPU wheel; README, Tested combinations)"
torch = pytest.importorskip("torch", reason=NO_TORCH)

# (tied, heads, kv_heads, head_dim): KV-group ratios 1/2/4; head_dim != hidden / heads.
SHAPES = [
    (True, 4, 4, 16),
    (False, 4, 2, 16),
    (False, 8, 2, 8),
    (True, 4, 1, 24),
]


def _hf_model(tmp_path, tied, heads, kv_heads, head_dim, seed=0):
    torch.manual_seed(seed)
    config = transformers.Qwen3Config(
        vocab_size=96,
        hidden_size=48,
        intermediate_size=80,
        num_hidden_layers=2,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        tie_word_embeddings=tied,
        rope_theta=10_000.0,
        rms_norm_eps=1e-6,
        max_position_embeddings=128,
    )
    model = transformers.Qwen3ForCausalLM(config).eval()
    with torch.no_grad():  # non-trivial norm scales so q/k/layer norms are really tested.
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
    model.save_pretrained(tmp_path)
    return model


@nnx.jit
def forward(model, ids, positions):
    return model(ids, positions)


def _inputs(batch=2, length=9, vocab=96):
    ids = np.random.RandomState(1).randint(0, vocab, (batch, length))
    return ids, np.broadcast_to(np.arange(length), ids.shape)


def _hf_logits(model, ids):
    with torch.no_grad():
        return model(torch.tensor(ids)).logits.float().numpy()


@pytest.mark.parametrize("tied,heads,kv_heads,head_dim", SHAPES)
def test_logits_match_transformers(tmp_path, tied, heads, kv_heads, head_dim):
    hf = _hf_model(tmp_path, tied, heads, kv_heads, head_dim)
    ids, pos = _inputs()
    model, config = load_hf_checkpoint(tmp_path)
    assert config.tie_word_embeddings == tied and config.head_dim == head_dim
    got = np.asarray(forward(model, jnp.asarray(ids), jnp.asarray(pos)))
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, _hf_logits(hf, ids), atol=1e-4, rtol=0)


@pytest.mark.parametrize("scan", [False, True])
def test_export_reloads_in_transformers(tmp_path, scan):
    hf = _hf_model(tmp_path / "hf", False, 4, 2, 16)
    ids, pos = _inputs()
    model, config = load_hf_checkpoint(tmp_path / "hf", scan_layers=scan, remat="full")
    np.testing.assert_allclose(
        np.asarray(forward(model, jnp.asarray(ids), jnp.asarray(pos))),
        _hf_logits(hf, ids),
        atol=1e-4,
        rtol=0,
    )
    # A small shard limit forces the sharded layout with an index file.
    files = save_hf_checkpoint(model, config, tmp_path / "out", max_shard_size=30_000)
    assert len(files) > 1 and (tmp_path / "out" / "model.safetensors.index.json").exists()
    assert "param_dtype" not in json.loads((tmp_path / "out" / "config.json").read_text())
    reloaded = transformers.Qwen3ForCausalLM.from_pretrained(tmp_path / "out").eval()
    np.testing.assert_allclose(_hf_logits(reloaded, ids), _hf_logits(hf, ids), atol=1e-6, rtol=0)
    again, _ = load_hf_checkpoint(tmp_path / "out")
    np.testing.assert_allclose(
        np.asarray(forward(again, jnp.asarray(ids), jnp.asarray(pos))),
        _hf_logits(hf, ids),
        atol=1e-4,
        rtol=0,
    )


def test_tied_export_is_single_file(tmp_path):
    _hf_model(tmp_path / "hf", True, 4, 2, 16)
    model, config = load_hf_checkpoint(tmp_path / "hf")
    files = save_hf_checkpoint(model, config, tmp_path / "out")
    assert [f.name for f in files] == ["model.safetensors"]
    reloaded = transformers.Qwen3ForCausalLM.from_pretrained(tmp_path / "out")
    assert reloaded.config.tie_word_embeddings


def test_bf16_compute_within_tolerance(tmp_path):
    """bf16 weights and matmuls (float32 accumulation, norms, softmax): logits within 0.01
    of fp32 HF (measured 0.0034-0.0041 over the four shapes)."""
    hf = _hf_model(tmp_path, False, 4, 2, 16)
    ids, pos = _inputs()
    model, config = load_hf_checkpoint(tmp_path, dtype=jnp.bfloat16)
    assert config.dtype == jnp.bfloat16 and config.param_dtype == jnp.bfloat16
    got = np.asarray(forward(model, jnp.asarray(ids), jnp.asarray(pos)))
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, _hf_logits(hf, ids), atol=1e-2, rtol=0)


def test_missing_tensor_is_a_clear_error(tmp_path):
    _hf_model(tmp_path / "hf", True, 4, 2, 16)
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    config["tie_word_embeddings"] = False  # now lm_head.weight is required but absent.
    (tmp_path / "hf" / "config.json").write_text(json.dumps(config))
    with pytest.raises(KeyError, match="lm_head.weight"):
        load_hf_checkpoint(tmp_path / "hf")
