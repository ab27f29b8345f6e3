"""HF export for weight syncs: the compute dtype, and only the last versions on disk."""

import json

import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from flax import nnx

from orchestra_jax.models import safetensors_stream as st
from orchestra_jax.models.hf_checkpoint import prune_versions, save_hf_checkpoint
from orchestra_jax.models.qwen3.model import Qwen3Config, Qwen3ForCausalLM


def test_export_in_the_compute_dtype(tmp_path):
    config = Qwen3Config.preset("tiny", dtype=jnp.bfloat16)  # float32 parameters
    model = Qwen3ForCausalLM(config, rngs=nnx.Rngs(0))
    [file] = save_hf_checkpoint(model, config, tmp_path, dtype=config.dtype)
    assert json.loads((tmp_path / "config.json").read_text())["torch_dtype"] == "bfloat16"
    refs = st.index_checkpoint(tmp_path)
    down = refs["model.layers.1.mlp.down_proj.weight"].read()
    assert down.dtype == ml_dtypes.bfloat16
    want = np.asarray(model.model.layers[1].mlp.down_proj.kernel[...]).T.astype(ml_dtypes.bfloat16)
    np.testing.assert_array_equal(down, want)
    # 106,880 parameters at 2 bytes (the float32 export: 4), plus a small JSON header.
    [full] = save_hf_checkpoint(model, config, tmp_path / "f32")
    # (The files are `epath.Path`s, local or gs://: their size is `stat().length`.)
    assert 0 < file.stat().length - 106_880 * 2 < 4096
    assert 0 < full.stat().length - 106_880 * 4 < 4096


def test_prune_versions_keeps_the_newest(tmp_path):
    for v in (1, 2, 10, 3):
        (tmp_path / f"v{v}").mkdir()
        (tmp_path / f"v{v}" / "model.safetensors").write_text("x")
    (tmp_path / "notes").mkdir()
    removed = prune_versions(tmp_path, keep=2)
    assert sorted(p.name for p in removed) == ["v1", "v2"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes", "v10", "v3"]
    with pytest.raises(ValueError, match="keep"):
        prune_versions(tmp_path, keep=0)
