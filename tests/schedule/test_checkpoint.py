"""Loading local Hugging Face folders: single file, sharded, tied, dtypes, and clear refusals."""
import json

import pytest
import torch

from megavm.core.errors import CheckpointError
from megavm.schedule.checkpoint import load, read_config
from megavm.schedule.models import PRESETS
from megavm.schedule.weights import random_hf_weights

safetensors = pytest.importorskip("safetensors.torch")

CFG = PRESETS["tiny"]
HF_CONFIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2,
             "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 96, "vocab_size": 256,
             "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "tie_word_embeddings": False, "hidden_act": "silu"}


def write(path, tensors, config=HF_CONFIG, shards=1):
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config))
    names = sorted(tensors)
    if shards == 1:
        safetensors.save_file({n: tensors[n].contiguous() for n in names}, str(path / "model.safetensors"))
        return path
    weight_map = {}
    for s in range(shards):
        file = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        part = names[s::shards]
        safetensors.save_file({n: tensors[n].contiguous() for n in part}, str(path / file))
        weight_map.update({n: file for n in part})
    (path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return path


@pytest.mark.parametrize("shards", [1, 3])
@pytest.mark.parametrize("dtype, want", [(torch.float32, "f32"), (torch.bfloat16, "bf16")])
def test_loads_exact_tensors(tmp_path, shards, dtype, want):
    hf = random_hf_weights(CFG, dtype, seed=3)
    extra = {"model.layers.0.self_attn.rotary_emb.inv_freq": torch.ones(8)}
    ck = load(write(tmp_path, {**hf, **extra}, shards=shards))
    assert ck.cfg == CFG and ck.dtype == want and ck.notes == []
    assert sorted(ck.hf) == sorted(hf), f"{shards=}: loaded {sorted(set(ck.hf) ^ set(hf))} unexpectedly"
    for n, t in hf.items():
        assert ck.hf[n].dtype == dtype and torch.equal(ck.hf[n], t), f"{shards=}, {dtype=}: {n} differs"


def test_float16_becomes_bf16_with_a_note(tmp_path):
    hf = random_hf_weights(CFG, torch.float16, seed=3)
    ck = load(write(tmp_path, hf))
    assert ck.dtype == "bf16" and all(t.dtype == torch.bfloat16 for t in ck.hf.values())
    assert any("float16" in n and "bfloat16" in n for n in ck.notes), ck.notes
    assert torch.equal(ck.hf["model.norm.weight"], hf["model.norm.weight"].to(torch.bfloat16))


def test_dtype_override(tmp_path):
    ck = load(write(tmp_path, random_hf_weights(CFG, torch.float32, seed=3)), dtype="bf16")
    assert ck.dtype == "bf16" and all(t.dtype == torch.bfloat16 for t in ck.hf.values()), ck.notes


def test_tied_embeddings_need_no_lm_head(tmp_path):
    cfg = {**HF_CONFIG, "tie_word_embeddings": True}
    hf = {n: t for n, t in random_hf_weights(CFG, torch.float32, seed=3).items() if n != "lm_head.weight"}
    ck = load(write(tmp_path, hf, cfg))
    assert ck.cfg.tied_embeddings and "lm_head.weight" not in ck.hf


def test_missing_tensor_named(tmp_path):
    hf = random_hf_weights(CFG, torch.float32, seed=3)
    del hf["model.layers.1.mlp.up_proj.weight"], hf["lm_head.weight"]
    with pytest.raises(CheckpointError, match=r"lacks 2 tensor\(s\).*model\.layers\.1\.mlp\.up_proj\.weight"):
        load(write(tmp_path, hf))


def test_misshapen_tensor_named(tmp_path):
    hf = random_hf_weights(CFG, torch.float32, seed=3)
    hf["model.layers.0.self_attn.k_proj.weight"] = torch.zeros(64, 64)
    with pytest.raises(CheckpointError, match=r"k_proj\.weight: \(64, 64\), expected \(32, 64\)"):
        load(write(tmp_path, hf))


def test_refusals(tmp_path):
    with pytest.raises(CheckpointError, match="no config.json"):
        load(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(HF_CONFIG))
    with pytest.raises(CheckpointError, match="neither model.safetensors nor"):
        load(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(CheckpointError, match="config.json: field 'hidden_size' is missing"):
        read_config(tmp_path)
    gpt2 = {**HF_CONFIG, "model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]}
    (tmp_path / "config.json").write_text(json.dumps(gpt2))
    with pytest.raises(CheckpointError, match="model_type='gpt2' \\(GPT2LMHeadModel\\) is not supported"):
        read_config(tmp_path)


def test_index_naming_absent_shard(tmp_path):
    write(tmp_path, random_hf_weights(CFG, torch.float32, seed=3), shards=2)
    (tmp_path / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(CheckpointError, match="lists shards that are not there.*model-00002-of-00002"):
        load(tmp_path)

