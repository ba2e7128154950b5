"""PEFT LoRA adapters, built and saved by the peft package itself (which nobody here wrote), loaded by
megavm.schedule.adapters: the exact A and B tensors, the scale, a LoRA Linear forward, and a table of
adapters megavm must refuse with one error naming the culprit."""
from __future__ import annotations

import copy
import json
import math
import shutil
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")
st = pytest.importorskip("safetensors.torch")

from megavm.core.errors import CheckpointError, ConfigError  # noqa: E402
from megavm.schedule.adapters import TARGETS, Adapter, key, load_adapter  # noqa: E402
from megavm.schedule.checkpoint import read_config  # noqa: E402
from tests.hf_families import BASE  # noqa: E402

HF_NAMES = {"q": "q_proj", "k": "k_proj", "v": "v_proj", "o": "o_proj", "gate": "gate_proj", "up": "up_proj",
            "down": "down_proj"}
R, ALPHA = 4, 8


def _base(path: Path, **fields):
    """A tiny random f32 LlamaForCausalLM saved under path -> (model, megavm ModelConfig)."""
    torch.manual_seed(5)
    m = transformers.LlamaForCausalLM(transformers.LlamaConfig(**{**BASE, **fields})).float().eval()
    m.save_pretrained(path, safe_serialization=True)
    return m, read_config(path)


@pytest.fixture(scope="module")
def bases(tmp_path_factory):
    root = tmp_path_factory.mktemp("bases")
    return {"llama": _base(root / "llama"), "llama-hd24": _base(root / "hd24", head_dim=24)}


def _adapter(base, path: Path, targets, r=R, alpha=ALPHA, **kw):
    """A peft LoRA model over a copy of base, saved under path (B non-zero) -> the peft model."""
    torch.manual_seed(11)
    pm = peft.get_peft_model(copy.deepcopy(base), peft.LoraConfig(
        r=r, lora_alpha=alpha, target_modules=targets, init_lora_weights=False, **kw)).eval()
    pm.save_pretrained(path)
    return pm


def _module(pm, layer: int, target: str):
    block = pm.base_model.model.model.layers[layer]
    return getattr(block.mlp if target in ("gate", "up", "down") else block.self_attn, HF_NAMES[target])


@pytest.mark.parametrize("base, targets, rslora", [
    ("llama", ["q_proj", "v_proj"], False),
    ("llama", ["down_proj", "k_proj", "o_proj", "up_proj"], True),
    ("llama-hd24", "all-linear", False),             # peft saves this as full module paths
    ("llama-hd24", ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"], True),
])
def test_loads_exactly_what_peft_saved(bases, tmp_path, base, targets, rslora):
    model, cfg = bases[base]
    pm = _adapter(model, tmp_path / "ad", targets, use_rslora=rslora)
    ad = load_adapter(tmp_path / "ad", cfg)
    want = TARGETS if targets == "all-linear" else tuple(t for t in TARGETS if HF_NAMES[t] in targets)
    scale = ALPHA / math.sqrt(R) if rslora else ALPHA / R
    assert isinstance(ad, Adapter) and ad.path == str(tmp_path / "ad"), ad
    assert (ad.rank, ad.targets) == (R, want), f"{base}, {targets}: {ad.rank=}, {ad.targets=}"
    assert ad.scale == scale == _module(pm, 0, want[0]).scaling["default"], f"{base}, {rslora=}: {ad.scale}"
    assert sorted(ad.a) == sorted(ad.b) == sorted((i, t) for i in range(cfg.n_layers) for t in want)
    for (i, t), a in ad.a.items():
        mod = _module(pm, i, t)
        a_ref, b_ref = mod.lora_A["default"].weight, mod.lora_B["default"].weight
        assert a.dtype == ad.b[i, t].dtype == torch.float32 and a.is_contiguous() and ad.b[i, t].is_contiguous()
        assert torch.equal(a, a_ref.float()) and torch.equal(ad.b[i, t], b_ref.float()), f"{base}: {(i, t)} differs"
        assert b_ref.abs().max() > 0, f"{base}: {(i, t)} lora_B is zero, the test proves nothing"


@pytest.mark.parametrize("target", ["q", "o", "down"])
def test_lora_forward_matches_peft(bases, tmp_path, target):
    model, cfg = bases["llama-hd24"]
    pm = _adapter(model, tmp_path / "ad", "all-linear")
    ad = load_adapter(tmp_path / "ad", cfg)
    mod = _module(pm, 1, target)
    x = torch.randn(3, mod.in_features, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        theirs = mod(x)
        ours = x @ mod.base_layer.weight.T + ad.scale * (x @ ad.a[1, target].T) @ ad.b[1, target].T
        lora_only = ad.scale * (x @ ad.a[1, target].T) @ ad.b[1, target].T
    err = (ours - theirs).abs().max().item() / theirs.abs().max().item()
    assert err <= 1e-5, f"{target}: max |ours - peft| / max |peft| = {err:.2e}"
    assert lora_only.abs().max() > 1e-3 * theirs.abs().max(), f"{target}: the LoRA term is negligible"


def test_half_precision_adapters_load_as_f32(bases, tmp_path):
    model, cfg = bases["llama"]
    _adapter(model, tmp_path / "ad", ["q_proj", "down_proj"])
    f = tmp_path / "ad" / "adapter_model.safetensors"
    tensors = st.load_file(str(f))
    half = {n: t.to(torch.bfloat16 if "lora_A" in n else torch.float16) for n, t in tensors.items()}
    st.save_file(half, str(f))
    ad = load_adapter(tmp_path / "ad", cfg)
    for (i, t), a in ad.a.items():
        assert a.dtype == torch.float32 and torch.equal(a, half[key(i, t, "A")].float()), (i, t)
        assert torch.equal(ad.b[i, t], half[key(i, t, "B")].float()), (i, t)


def test_accepts_all_linear_written_by_hand(bases, tmp_path):
    model, cfg = bases["llama"]
    _adapter(model, tmp_path / "ad", "all-linear")
    conf = tmp_path / "ad" / "adapter_config.json"
    conf.write_text(json.dumps({**json.loads(conf.read_text()), "target_modules": "all-linear"}))
    assert load_adapter(tmp_path / "ad", cfg).targets == TARGETS


# --- refusals: each case mutates a copy of a good adapter (q, k, o, down; r=4) ---------------------

Q0A, K1B, O1B, DOWN1B = key(0, "q", "A"), key(1, "k", "B"), key(1, "o", "B"), key(1, "down", "B")


def _config(**fields):
    def edit(d: Path):
        f = d / "adapter_config.json"
        f.write_text(json.dumps({**json.loads(f.read_text()), **fields}))
    return edit


def _tensors(fn):
    def edit(d: Path):
        f = d / "adapter_model.safetensors"
        tensors = st.load_file(str(f))
        fn(tensors)
        st.save_file(tensors, str(f))
    return edit


def _nan(t: dict):
    t[O1B] = t[O1B].clone()
    t[O1B].view(-1)[:3] = float("nan")


def _truncate(d: Path):
    f = d / "adapter_model.safetensors"
    f.write_bytes(f.read_bytes()[:-10])


def _bin_only(d: Path):
    (d / "adapter_model.safetensors").unlink()
    torch.save({Q0A: torch.zeros(R, 64)}, d / "adapter_model.bin")


def _link_outside(d: Path):
    outside = d.parent / "outside.safetensors"
    (d / "adapter_model.safetensors").rename(outside)
    (d / "adapter_model.safetensors").symlink_to(outside)


BAD = {   # name -> (mutation, error type, text the message must hold)
    "peft_type": (_config(peft_type="PROMPT_TUNING"), ConfigError, "peft_type='PROMPT_TUNING'"),
    "r=0": (_config(r=0), ConfigError, "r=0"),
    "r=2.5": (_config(r=2.5), ConfigError, "r=2.5"),
    "r=true": (_config(r=True), ConfigError, "r=True"),
    "alpha-string": (_config(lora_alpha="8"), ConfigError, "lora_alpha='8'"),
    "target-regex": (_config(target_modules=r".*\.(q|v)_proj"), ConfigError, "regex"),
    "target-lm_head": (_config(target_modules=["q_proj", "lm_head"]), ConfigError, "lm_head"),
    "target-embed": (_config(target_modules=["embed_tokens"]), ConfigError, "embed_tokens"),
    "use_dora": (_config(use_dora=True), ConfigError, "use_dora=True"),
    "fan_in_fan_out": (_config(fan_in_fan_out=True), ConfigError, "fan_in_fan_out=True"),
    "bias": (_config(bias="all"), ConfigError, "bias='all'"),
    "modules_to_save": (_config(modules_to_save=["lm_head"]), ConfigError, "modules_to_save=['lm_head']"),
    "layers_to_transform": (_config(layers_to_transform=[0]), ConfigError, "layers_to_transform=[0]"),
    "layers_pattern": (_config(layers_pattern="layers"), ConfigError, "layers_pattern='layers'"),
    "rank_pattern": (_config(rank_pattern={"q_proj": 8}), ConfigError, "rank_pattern={'q_proj': 8}"),
    "alpha_pattern": (_config(alpha_pattern={"q_proj": 8}), ConfigError, "alpha_pattern"),
    "A-rank": (_tensors(lambda t: t.update({Q0A: torch.zeros(R + 1, 64)})), CheckpointError, f"{Q0A}: shape (5, 64)"),
    "B-out": (_tensors(lambda t: t.update({K1B: torch.zeros(40, R)})), CheckpointError, f"{K1B}: shape (40, 4)"),
    "missing": (_tensors(lambda t: t.pop(DOWN1B)), CheckpointError, DOWN1B),
    "unexpected": (_tensors(lambda t: t.update({"base_model.model.lm_head.lora_A.weight": torch.zeros(R, 64)})),
                   CheckpointError, "base_model.model.lm_head.lora_A.weight"),
    "int32": (_tensors(lambda t: t.update({Q0A: t[Q0A].to(torch.int32)})), CheckpointError, f"{Q0A}: dtype I32"),
    "nan": (_tensors(_nan), CheckpointError, f"{O1B} (3 values)"),
    "truncated": (_truncate, CheckpointError, "adapter_model.safetensors"),
    "zero-bytes": (lambda d: (d / "adapter_model.safetensors").write_bytes(b""), CheckpointError,
                   "adapter_model.safetensors"),
    "no-folder": (lambda d: shutil.rmtree(d), CheckpointError, "no such adapter folder"),
    "no-config": (lambda d: (d / "adapter_config.json").unlink(), CheckpointError, "no adapter_config.json"),
    "bin-only": (_bin_only, CheckpointError, "megavm reads adapter_model.safetensors"),
    "config-not-json": (lambda d: (d / "adapter_config.json").write_text("{r: 4,"), CheckpointError,
                        "adapter_config.json: not JSON"),
    "config-a-list": (lambda d: (d / "adapter_config.json").write_text("[]"), ConfigError, "not a JSON object"),
    "link-outside": (_link_outside, CheckpointError, "outside the checkpoint folder"),
}


@pytest.fixture(scope="module")
def good(bases, tmp_path_factory):
    d = tmp_path_factory.mktemp("good") / "ad"
    _adapter(bases["llama"][0], d, ["q_proj", "k_proj", "o_proj", "down_proj"])
    return d


@pytest.mark.parametrize("case", sorted(BAD))
def test_refuses_bad_adapters(bases, good, tmp_path, case):
    mutate, error, text = BAD[case]
    d = tmp_path / "ad"
    shutil.copytree(good, d)
    load_adapter(d, bases["llama"][1])                  # the copy is good before the mutation
    mutate(d)
    with pytest.raises(error) as e:
        load_adapter(d, bases["llama"][1])
    msg = str(e.value)
    assert text in msg and "\n" not in msg, f"{case}: {type(e.value).__name__}: {msg!r} lacks {text!r}"
    if case != "no-folder":
        assert str(d) in msg, f"{case}: {msg!r} does not name the folder {d}"


def test_adapter_for_another_model_is_refused(bases, good):
    """A q/k/o/down adapter of the hidden-64 model against head_dim 24: q's B rows and o's A columns differ."""
    with pytest.raises(CheckpointError, match=r"q_proj\.lora_B\.weight: shape \(64, 4\), expected \(96, 4\)"):
        load_adapter(good, bases["llama-hd24"][1])
