"""`megavm quantize`: a Hugging Face checkpoint folder -> a quantized one (schedule/quant.py), every
projection and the LM head in the format's layout; embeddings and norms as they were."""
from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import torch

from megavm.core.errors import UserError
from megavm.schedule import quant

PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def quantized_names(name: str) -> bool:
    """Whether a Hugging Face tensor is a weight the formats cover: a projection's or the LM head's."""
    return name == "lm_head.weight" or (name.endswith(".weight") and name.split(".")[-2] in PROJECTIONS)


def quantize_checkpoint(src: Path, fmt: str, out: Path) -> dict:
    """Write src's model quantized as fmt into out (config.json, model.safetensors); returns counts."""
    from safetensors.torch import save_file

    from megavm.schedule.checkpoint import _json, load
    if fmt not in quant.FORMATS:
        raise UserError(f"--format {fmt!r} is not one of {', '.join(quant.FORMATS)}")
    ck = load(src)
    hf_cfg = _json(Path(src) / "config.json", "a model config")
    tensors, n_q = {}, 0
    hf = dict(ck.hf)
    if "lm_head.weight" not in hf:               # tied: the head becomes a tensor of its own, quantized
        hf["lm_head.weight"] = hf["model.embed_tokens.weight"]
        hf_cfg["tie_word_embeddings"] = False
    for name, w in hf.items():
        if quantized_names(name):
            prefix = name[:-len("weight")]
            try:
                parts = quant.quantize(w, fmt)
            except Exception as e:
                raise UserError(f"{name}: {e}") from None
            tensors |= {prefix + k: v.contiguous() for k, v in parts.items()}
            n_q += 1
        else:
            tensors[name] = w.contiguous()
    hf_cfg["quantization_config"] = quant.config_entry(fmt)
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt", "megavm_format": fmt})
    (out / "config.json").write_text(json.dumps(hf_cfg, indent=2) + "\n")
    for extra in ("generation_config.json", "tokenizer.json", "tokenizer_config.json"):
        if (Path(src) / extra).is_file():
            shutil.copy(Path(src) / extra, out / extra)
    return {"quantized": n_q, "tensors": len(tensors)}


def dequantized(folder: Path) -> dict[str, torch.Tensor]:
    """The f32 Hugging Face tensors a quantized folder stands for (the oracle a quantized run is held to)."""
    from safetensors.torch import load_file
    cfg = json.loads((Path(folder) / "config.json").read_text())
    fmt = cfg["quantization_config"]["megavm_format"]
    t = load_file(str(Path(folder) / "model.safetensors"))
    parts = quant.PARTS[fmt]
    # a quantized weight is a prefix holding every part: the format's scale tensor names them
    prefixes = [n[:-len(parts[1])] for n in t if n.endswith("." + parts[1])]
    out = {p + "weight": quant.dequantize({k: t[p + k] for k in parts}, fmt) for p in prefixes}
    used = {p + k for p in prefixes for k in parts}
    return out | {n: v.float() for n, v in t.items() if n not in used}

def setup_quantize(p: argparse.ArgumentParser) -> None:
    p.add_argument("--checkpoint", metavar="DIR", required=True, help="a local Hugging Face folder (f32, bf16, f16)")
    p.add_argument("--format", required=True, choices=quant.FORMATS, help="the weight format (schedule/quant.py)")
    p.add_argument("--out", metavar="DIR", required=True, help="the quantized folder to write")


def cmd_quantize(a: argparse.Namespace) -> int:
    """Write a quantized copy of a checkpoint: every projection and the LM head in one weight format."""
    out = Path(a.out)
    if out.exists() and any(out.iterdir()):
        raise UserError(f"--out {out}: exists and is not empty")
    counts = quantize_checkpoint(Path(a.checkpoint), a.format, out)
    print(f"{a.checkpoint} -> {out}: {counts['quantized']} weights as {a.format}, {counts['tensors']} tensors")
    return 0
