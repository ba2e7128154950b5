"""A local Llama-family Hugging Face checkpoint folder -> ModelConfig and weights under Hugging Face names.

Reads config.json and model.safetensors, or the shards listed in model.safetensors.index.json, with
the safetensors library; only the tensors the config implies are loaded (extras such as rotary
inv_freq buffers are ignored). Programs hold f32 or bf16: float32 checkpoints load as f32, bfloat16
as bf16, float16 is converted to bf16 (with a note).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch

from megavm.core.errors import CheckpointError, ConfigError
from megavm.schedule.models import ModelConfig, hf_shapes

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"
DTYPES = {torch.float32: "f32", torch.bfloat16: "bf16", torch.float16: "bf16"}


@dataclass
class Checkpoint:
    path: Path
    cfg: ModelConfig
    hf: dict[str, torch.Tensor]      # Hugging Face names -> tensors, all of one dtype
    dtype: str                       # "f32" | "bf16"
    notes: list[str] = field(default_factory=list)


def _config_json(path: Path) -> dict:
    f = path / "config.json"
    if not f.is_file():
        raise CheckpointError(f"{path}: no config.json; expected a Hugging Face model folder")
    try:
        return json.loads(f.read_text())
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{f}: not JSON: {e}") from None


def read_config(path) -> ModelConfig:
    path = Path(path)
    try:
        return ModelConfig.from_hf(_config_json(path))
    except ConfigError as e:
        raise CheckpointError(f"{path / 'config.json'}: {e}") from None
    except (KeyError, TypeError) as e:
        raise CheckpointError(f"{path / 'config.json'}: cannot read a Llama config: {type(e).__name__}: {e}") from None


def config_dtype(path) -> str:
    """The program dtype that config.json's dtype (torch_dtype before transformers 5) implies, without
    reading the weights; load() decides from the tensors themselves."""
    hf = _config_json(Path(path))
    return "f32" if (hf.get("dtype") or hf.get("torch_dtype")) == "float32" else "bf16"


def tensor_files(path: Path) -> dict[str, Path]:
    """Tensor name -> the safetensors file holding it."""
    index = path / INDEX
    if index.is_file():
        weight_map = json.loads(index.read_text()).get("weight_map")
        if not isinstance(weight_map, dict):
            raise CheckpointError(f"{index}: no 'weight_map'")
        files = {name: path / f for name, f in weight_map.items()}
        absent = sorted({str(f) for f in files.values() if not f.is_file()})
        if absent:
            raise CheckpointError(f"{index} lists shards that are not there: {absent}")
        return files
    single = path / SINGLE
    if not single.is_file():
        found = sorted(p.name for p in path.glob("*.safetensors"))
        raise CheckpointError(f"{path}: neither {SINGLE} nor {INDEX}" +
                              (f" (found {found}; a sharded checkpoint needs its index)" if found else ""))
    from safetensors import safe_open
    with safe_open(single, "pt") as f:
        return {name: single for name in f.keys()}


def load(path, dtype: str | None = None) -> Checkpoint:
    """Load config and weights; `dtype` ("f32" | "bf16") overrides the checkpoint's own."""
    from safetensors import safe_open
    path = Path(path)
    cfg = read_config(path)
    files = tensor_files(path)
    want = hf_shapes(cfg)
    missing = [n for n in want if n not in files]
    if missing:
        raise CheckpointError(f"{path}: checkpoint lacks {len(missing)} tensor(s) its config.json implies: "
                              f"{missing[:8]}{' ...' if len(missing) > 8 else ''}")
    hf, bad = {}, []
    by_file: dict[Path, list[str]] = {}
    for name in want:
        by_file.setdefault(files[name], []).append(name)
    for file, names in by_file.items():
        with safe_open(file, "pt") as f:
            for name in names:
                shape = tuple(f.get_slice(name).get_shape())
                if shape != want[name]:
                    bad.append(f"{name}: {shape}, expected {want[name]}")
                else:
                    hf[name] = f.get_tensor(name)
    if bad:
        raise CheckpointError(f"{path}: tensor(s) with the wrong shape for config.json: {bad[:8]}")

    found = {t.dtype for t in hf.values()}
    unsupported = found - set(DTYPES)
    if unsupported:
        raise CheckpointError(f"{path}: tensors of dtype {sorted(map(str, unsupported))}; megavm loads "
                              "float32, bfloat16 or float16 checkpoints")
    notes = []
    own = "f32" if found == {torch.float32} else "bf16"
    if torch.float16 in found:
        notes.append("float16 checkpoint converted to bfloat16 (programs hold f32 or bf16 weights)")
    if len(found) > 1:
        notes.append(f"mixed dtypes {sorted(str(d) for d in found)} unified to {own}")
    if dtype is not None and dtype != own:
        notes.append(f"{own} checkpoint converted to {dtype} as asked")
    dtype = dtype or own
    tdt = {"f32": torch.float32, "bf16": torch.bfloat16}[dtype]
    hf = {n: t.to(tdt) for n, t in hf.items()}
    return Checkpoint(path, cfg, hf, dtype, notes)
