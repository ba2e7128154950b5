"""A PEFT LoRA adapter folder -> Adapter, strictly.

adapter_config.json is read with hf_config's typed field reads: anything that would change inference in
a way megavm does not implement (DoRA, biases, extra saved modules, per-layer ranks, ...) is one
ConfigError naming the field and its value. adapter_model.safetensors is checked from its header alone
(every key accounted for, shapes against the ModelConfig and r, dtypes) before any tensor is read; then
the tensors are read, refused if they hold NaN or inf, and kept as float32. The file helpers (JSON,
containment of links, header reads) are schedule/checkpoint.py's.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path

import torch

from megavm.core.errors import CheckpointError, ConfigError
from megavm.schedule.checkpoint import DTYPES, _contained, _header, _json, _safe_open
from megavm.schedule.hf_config import Fields
from megavm.schedule.models import ModelConfig

TARGETS = ("q", "k", "v", "o", "gate", "up", "down")
MODULES = {"q": "self_attn.q_proj", "k": "self_attn.k_proj", "v": "self_attn.v_proj", "o": "self_attn.o_proj",
           "gate": "mlp.gate_proj", "up": "mlp.up_proj", "down": "mlp.down_proj"}
CONFIG = "adapter_config.json"
WEIGHTS = "adapter_model.safetensors"
PICKLE = "adapter_model.bin"
PREFIX = "base_model.model.model.layers."        # PEFT's key prefix for a *ForCausalLM base model

# fields that must be false, and fields that must be absent, null or empty, with why megavm refuses them
_FLAGS = {"use_dora": "megavm applies plain LoRA, not DoRA", "fan_in_fan_out": "megavm reads [out, in] weights",
          "lora_bias": "megavm's LoRA B has no bias", "use_qalora": "QALoRA pools the input"}
_UNSET = {"modules_to_save": "megavm loads only LoRA A and B, not whole modules",
          "layers_to_transform": "megavm needs every layer adapted",
          "layers_pattern": "megavm needs every layer adapted",
          "rank_pattern": "megavm takes one rank for all modules",
          "alpha_pattern": "megavm takes one alpha for all modules",
          "trainable_token_indices": "megavm does not adapt embeddings",
          "layer_replication": "megavm does not replicate layers",
          "target_parameters": "megavm adapts modules, not parameters",
          "alora_invocation_tokens": "megavm does not implement activated LoRA",
          **{v: "a LoRA variant megavm does not implement"
             for v in ("velora_config", "monteclora_config", "use_bdlora", "arrow_config", "kasa_config")}}


@dataclass(frozen=True)
class Adapter:
    path: str                                   # the folder as given
    rank: int                                   # r
    scale: float                                # lora_alpha / r, or lora_alpha / sqrt(r) with use_rslora
    targets: tuple[str, ...]                    # which of TARGETS the adapter has, in TARGETS order
    a: dict[tuple[int, str], torch.Tensor] = field(repr=False)   # (layer, target) -> lora_A [rank, in], f32
    b: dict[tuple[int, str], torch.Tensor] = field(repr=False)   # (layer, target) -> lora_B [out, rank], f32


def features(cfg: ModelConfig, target: str) -> tuple[int, int]:
    """(in_features, out_features) of a target's projection."""
    q, kv = cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim
    return {"q": (cfg.dim, q), "k": (cfg.dim, kv), "v": (cfg.dim, kv), "o": (q, cfg.dim),
            "gate": (cfg.dim, cfg.ffn_dim), "up": (cfg.dim, cfg.ffn_dim), "down": (cfg.ffn_dim, cfg.dim)}[target]


def key(layer: int, target: str, ab: str) -> str:
    """PEFT's safetensors name of a LoRA weight; ab is "A" or "B"."""
    return f"{PREFIX}{layer}.{MODULES[target]}.lora_{ab}.weight"


def _targets(f: Fields, n_layers: int) -> tuple[str, ...]:
    """target_modules -> targets. PEFT matches a list entry against a module's path or a dot-suffix of it,
    so "q_proj", "self_attn.q_proj" and "model.layers.0.self_attn.q_proj" (what PEFT saves for
    all-linear) all name q; a layer-specific entry leaves other layers without tensors, refused later."""
    v = f.hf.get("target_modules")
    if v == "all-linear":
        return TARGETS
    if isinstance(v, str):
        raise f.bad("target_modules", v, "is a regex to PEFT; megavm takes a list of module names or 'all-linear'")
    if not isinstance(v, list) or not v:
        raise f.bad("target_modules", v, "must be a non-empty list of module names or 'all-linear'")
    names = {}
    for i in range(n_layers):
        for t in TARGETS:
            parts = f"model.layers.{i}.{MODULES[t]}".split(".")
            names |= {".".join(parts[j:]): t for j in range(len(parts))}
    bad = [m for m in v if not isinstance(m, str) or m not in names]
    if bad:
        raise ConfigError(f"{f.where}: target_modules holds {bad[:8]}, not modules megavm adapts (q_proj, k_proj, "
                          f"v_proj, o_proj, gate_proj, up_proj, down_proj of layers 0..{n_layers - 1})")
    return tuple(t for t in TARGETS if t in {names[m] for m in v})


def parse_config(hf, where: str, n_layers: int) -> tuple[int, float, tuple[str, ...]]:
    """adapter_config.json's dict -> (r, scale, targets); refuses what megavm cannot honour."""
    if not isinstance(hf, dict):
        raise ConfigError(f"{where}: not a JSON object but {type(hf).__name__}")
    f = Fields(hf, where)
    if (kind := f.text("peft_type")) != "LORA":
        raise f.bad("peft_type", kind, "is not supported: megavm loads LORA adapters")
    r = f.integer("r")
    alpha = f.number("lora_alpha")
    rslora = f.flag("use_rslora", False)
    for name, why in _FLAGS.items():
        if f.flag(name, False):
            raise f.bad(name, True, f"is not supported: {why}")
    if (bias := f.text("bias", "none")) != "none":
        raise f.bad("bias", bias, "is not supported: megavm's adapters add no biases (bias must be 'none')")
    for name, why in _UNSET.items():
        v = hf.get(name)
        if not (v is None or v is False or (isinstance(v, (list, dict, str)) and not v)):
            raise f.bad(name, v, f"is not supported: {why}")
    return r, (alpha / math.sqrt(r) if rslora else alpha / r), _targets(f, n_layers)


def _weights_file(path: Path) -> Path:
    st = _contained(path, path / WEIGHTS)
    if not st.is_file():
        if (path / PICKLE).exists():
            raise CheckpointError(f"{path}: only {PICKLE} (a pickle); megavm reads {WEIGHTS} "
                                  "(save with safe_serialization=True)")
        raise CheckpointError(f"{path}: no {WEIGHTS}")
    return st


def _check_header(st: Path, cfg: ModelConfig, r: int, targets: tuple[str, ...]) -> None:
    """Every key accounted for, every shape and dtype right, from the header alone."""
    want = {}
    for i in range(cfg.n_layers):
        for t in targets:
            n_in, n_out = features(cfg, t)
            want[key(i, t, "A")], want[key(i, t, "B")] = (r, n_in), (n_out, r)
    header = _header(st)
    missing, extra = [n for n in want if n not in header], sorted(n for n in header if n not in want)
    if missing or extra:
        raise CheckpointError(f"{st}: " + "; ".join(
            ([f"lacks {len(missing)} tensor(s) adapter_config.json implies: {missing[:8]}"] if missing else []) +
            ([f"{len(extra)} unexpected tensor(s): {extra[:8]}"] if extra else [])))
    bad = []
    for name, shape in want.items():
        got, dtype = header[name]
        if got != shape:
            bad.append(f"{name}: shape {got}, expected {shape} (r={r})")
        elif dtype not in DTYPES:
            bad.append(f"{name}: dtype {dtype}; megavm loads F32, BF16 or F16")
    if bad:
        raise CheckpointError(f"{st}: tensor(s) that do not fit the model and r: {bad[:8]}")


def load_adapter(path, cfg: ModelConfig) -> Adapter:
    """A PEFT LoRA adapter folder for a model of cfg -> Adapter (weights float32)."""
    given, path = os.fspath(path), Path(path)
    if not path.is_dir():
        raise CheckpointError(f"{path}: {'not a folder' if path.exists() else 'no such adapter folder'}")
    try:
        hf = _json(path / CONFIG, "a PEFT adapter folder")
    except OSError as e:
        raise CheckpointError(f"{path / CONFIG}: cannot be read: {e}") from None
    r, scale, targets = parse_config(hf, str(path / CONFIG), cfg.n_layers)
    st = _weights_file(path)
    _check_header(st, cfg, r, targets)
    keys = [(i, t) for i in range(cfg.n_layers) for t in targets]
    try:
        with _safe_open()(st, "pt") as f:
            raw = {(k, ab): f.get_tensor(key(*k, ab)) for k in keys for ab in "AB"}
    except Exception as e:     # the library's SafetensorError, or an OS error reading the file
        raise CheckpointError(f"{st}: reading its tensors failed: {str(e)[:200]}") from None
    nonfinite = [(key(*k, ab), int((~torch.isfinite(x)).sum())) for (k, ab), x in raw.items()
                 if not torch.isfinite(x).all()]
    if nonfinite:
        raise CheckpointError(f"{st}: tensor(s) holding NaN or inf: " +
                              ", ".join(f"{n} ({c} values)" for n, c in nonfinite[:8]))
    a = {k: raw[k, "A"].to(torch.float32).contiguous() for k in keys}
    b = {k: raw[k, "B"].to(torch.float32).contiguous() for k in keys}
    return Adapter(given, r, scale, targets, a, b)


def random_adapter(cfg: ModelConfig, rank: int, targets: tuple[str, ...], seed: int, scale: float = 1.0) -> Adapter:
    """Seeded random A [rank, in] and B [out, rank] on targets, drawn so the low-rank term is of the
    order of its projection's output (tests and benchmarks; a real adapter comes from load_adapter)."""
    g = torch.Generator().manual_seed(seed)
    a, b = {}, {}
    for l in range(cfg.n_layers):
        for t in targets:
            k, n = features(cfg, t)
            a[(l, t)] = torch.randn(rank, k, generator=g) / k ** 0.5
            b[(l, t)] = torch.randn(n, rank, generator=g) / rank ** 0.5
    return Adapter(f"random-{seed}", rank, scale, tuple(x for x in TARGETS if x in targets), a, b)
