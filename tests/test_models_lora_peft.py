"""LoRA adapters: logits equal transformers + PEFT's for the same adapter files,
both ways; merging; what a PEFT folder may not hold."""

import json

import jax.numpy as jnp
import numpy as np
import pytest
import transformers
from flax import nnx

from orchestra_jax.models import peft_adapter
from orchestra_jax.models.hf_checkpoint import load_hf_checkpoint, save_hf_checkpoint
from orchestra_jax.models.lora import LoRAParam, LoRASpec
from tests.float_roundoff import qwen3_forward_terms, two_evaluations_apart

# PyPI's torch on Python 3.12+ is the CUDA build; CI runs these tests on 3.11 with
# the CPU wheel (README, "Tested combinations").
NO_TORCH = "needs PyTorch (CI: Python 3.11 with the CPU wheel; README, Tested combinations)"
torch = pytest.importorskip("torch", reason=NO_TORCH)
peft = pytest.importorskip("peft", reason=NO_TORCH)

TARGETS = ("q", "v", "o", "up", "down")


def _hf_base(folder):
    torch.manual_seed(0)
    config = transformers.Qwen3Config(
        vocab_size=96,
        hidden_size=48,
        intermediate_size=80,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        tie_word_embeddings=False,
        rope_theta=10_000.0,
        max_position_embeddings=128,
    )
    model = transformers.Qwen3ForCausalLM(config).eval()
    model.save_pretrained(folder)
    return model


def _peft_model(base, rank=4, alpha=8.0, targets=TARGETS, dropout=0.0):
    config = peft.LoraConfig(
        r=rank,
        lora_alpha=alpha,
        target_modules=[f"{t}_proj" for t in targets],
        lora_dropout=dropout,
        task_type="CAUSAL_LM",
    )
    model = peft.get_peft_model(base, config).eval()
    with torch.no_grad():  # random non-zero adapters: B is 0 at PEFT's init
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.copy_(0.3 * torch.randn_like(p))
    return model


def _inputs(batch=2, length=9):
    ids = np.random.RandomState(1).randint(0, 96, (batch, length))
    return ids, np.broadcast_to(np.arange(length), ids.shape)


def _ours(model, ids, pos):
    return np.asarray(nnx.jit(lambda m, i, p: m(i, p))(model, jnp.asarray(ids), jnp.asarray(pos)))


def _theirs(model, ids):
    with torch.no_grad():
        return model(torch.tensor(ids)).logits.float().numpy()


@pytest.mark.parametrize("scan", [False, True])
def test_peft_saved_adapter_loads_here_with_equal_logits(tmp_path, scan):
    theirs = _peft_model(_hf_base(tmp_path / "base"))
    theirs.save_pretrained(tmp_path / "adapter")
    spec = peft_adapter.read_spec(tmp_path / "adapter")
    assert (spec.rank, spec.alpha, set(spec.targets)) == (4, 8.0, set(TARGETS))
    model, _ = load_hf_checkpoint(tmp_path / "base", lora=spec, scan_layers=scan)
    peft_adapter.load_adapter(model, tmp_path / "adapter")
    ids, pos = _inputs()
    want = _theirs(theirs, ids)
    np.testing.assert_allclose(_ours(model, ids, pos), want, atol=1e-4, rtol=0)


def test_an_adapter_trained_with_dropout_evaluates_and_merges_but_does_not_train(tmp_path):
    from orchestra_jax.rl.learner import Learner, LearnerConfig

    theirs = _peft_model(_hf_base(tmp_path / "base"), dropout=0.05)  # the usual published one
    theirs.save_pretrained(tmp_path / "adapter")
    spec = peft_adapter.read_spec(tmp_path / "adapter")
    assert spec.dropout == 0.05 and spec.rank == 4
    model, _ = load_hf_checkpoint(tmp_path / "base", lora=spec)
    peft_adapter.load_adapter(model, tmp_path / "adapter")
    ids, pos = _inputs()
    ours = _ours(model, ids, pos)
    np.testing.assert_allclose(ours, _theirs(theirs, ids), atol=1e-4, rtol=0)  # PEFT's eval
    peft_adapter.merge_to_hf(tmp_path / "base", tmp_path / "adapter", tmp_path / "merged")
    merged = transformers.Qwen3ForCausalLM.from_pretrained(tmp_path / "merged").eval()
    np.testing.assert_allclose(_theirs(merged, ids), ours, atol=1e-4, rtol=0)
    with pytest.raises(ValueError, match=r"dropout 0\.05: training runs adapters without"):
        Learner(model, LearnerConfig())


def test_exported_adapter_loads_in_peft_with_equal_logits(tmp_path):
    base = _hf_base(tmp_path / "base")
    spec = LoRASpec(rank=3, alpha=5.0, targets=("k", "gate", "down"))
    model, _ = load_hf_checkpoint(tmp_path / "base", lora=spec, seed=4)
    adapters = nnx.state(model, LoRAParam)
    rng = np.random.default_rng(0)
    nnx.update(
        model,
        nnx.from_flat_state(
            [
                (k, v.replace(jnp.asarray(0.3 * rng.standard_normal(v.shape), jnp.float32)))
                for k, v in nnx.to_flat_state(adapters)
            ]
        ),
    )
    peft_adapter.save_adapter(model, tmp_path / "adapter", base_model_name_or_path="tiny")
    config = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert config["target_modules"] == ["down_proj", "gate_proj", "k_proj"]
    theirs = peft.PeftModel.from_pretrained(base, tmp_path / "adapter").eval()
    ids, pos = _inputs()
    ours = _ours(model, ids, pos)
    np.testing.assert_allclose(ours, _theirs(theirs, ids), atol=1e-4, rtol=0)
    # Merged into a plain checkpoint: transformers alone computes the same logits.
    peft_adapter.merge_to_hf(tmp_path / "base", tmp_path / "adapter", tmp_path / "merged")
    merged = transformers.Qwen3ForCausalLM.from_pretrained(tmp_path / "merged").eval()
    np.testing.assert_allclose(_theirs(merged, ids), ours, atol=1e-4, rtol=0)


def test_fresh_adapters_start_as_peft_does(tmp_path):
    _hf_base(tmp_path / "base")
    spec = LoRASpec(rank=8, alpha=16.0, targets=("q", "down"))
    model, _ = load_hf_checkpoint(tmp_path / "base", lora=spec, seed=0)
    plain, _ = load_hf_checkpoint(tmp_path / "base")
    ids, pos = _inputs()
    # B = 0: the adapters add nothing (the lora_b bits are zero); the two models compile
    # apart, so their logits agree up to float32 round-off (tests/float_roundoff.py).
    lora_b = [v for k, v in nnx.to_flat_state(nnx.state(model, LoRAParam)) if k[-1] == "lora_b"]
    assert lora_b and all(not np.asarray(b.get_value()).any() for b in lora_b)
    want = _ours(plain, ids, pos)
    terms = qwen3_forward_terms(plain.config, ids.shape[1])
    tolerance = two_evaluations_apart(terms, np.abs(want).max())
    np.testing.assert_allclose(_ours(model, ids, pos), want, rtol=0, atol=tolerance)
    layer = model.model.layers[0]
    a = np.asarray(layer.mlp.down_proj.lora_a[...])  # [in=80, r]
    assert (
        a.shape == (80, 8)
        and np.abs(a).max() <= 1 / np.sqrt(80)
        and a.std() > 0.5 / np.sqrt(3 * 80)
    )
    assert not np.asarray(layer.self_attn.q_proj.lora_b[...]).any()
    with pytest.raises(ValueError, match="LoRA adapters"):
        save_hf_checkpoint(model, model.config, tmp_path / "refused")


@pytest.mark.parametrize(
    "change,message",
    [
        ({"use_rslora": True}, "unsupported"),
        ({"use_dora": True}, "unsupported"),
        ({"rank_pattern": {"q_proj": 2}}, "unsupported"),
        ({"target_modules": "all-linear"}, "list of names"),
        ({"target_modules": ["lm_head"]}, "not a Qwen3 projection"),
        ({"lora_dropout": 1.0}, "dropout"),
    ],
)
def test_unsupported_adapter_configs_are_refused(tmp_path, change, message):
    config = peft_adapter.adapter_config(LoRASpec(rank=2, alpha=4.0))
    config.update(change)
    tmp_path.joinpath("adapter_config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=message):
        peft_adapter.read_spec(tmp_path)


def test_an_adapter_of_other_settings_or_tensors_is_refused(tmp_path):
    _hf_base(tmp_path / "base")
    model, _ = load_hf_checkpoint(tmp_path / "base", lora=LoRASpec(rank=2, alpha=4.0))
    peft_adapter.save_adapter(model, tmp_path / "a")
    other, _ = load_hf_checkpoint(tmp_path / "base", lora=LoRASpec(rank=3, alpha=4.0))
    with pytest.raises(ValueError, match="r=2"):
        peft_adapter.load_adapter(other, tmp_path / "a")
    tensors = peft_adapter.read_adapter_tensors(tmp_path / "a")
    from safetensors.numpy import save_file

    name = next(iter(tensors))
    save_file(
        {k: v for k, v in tensors.items() if k != name},
        tmp_path / "a" / "adapter_model.safetensors",
    )
    with pytest.raises(KeyError, match="lacks"):
        peft_adapter.load_adapter(model, tmp_path / "a")
