"""A local Llama-family Hugging Face checkpoint folder -> ModelConfig and weights under Hugging Face names.

config.json is parsed strictly (schedule/hf_config.py). The weights are model.safetensors, or the
shards model.safetensors.index.json lists, each inside the folder. inspect() reads only the
safetensors headers (the library checks each file's header against its size) and holds every tensor
the config implies against them: present, of the right shape, of a float dtype megavm loads. load()
does that first, then reads the tensors and names any that hold NaN or inf. Extra tensors (rotary
inv_freq buffers, say) are ignored. float32 checkpoints load as f32, bfloat16 as bf16, float16 is
converted to bf16 (with a note).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch

from megavm.core.errors import CheckpointError, ConfigError
from megavm.schedule import hf_config
from megavm.schedule.models import ModelConfig
from megavm.schedule.weights import hf_shapes, projection

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"
DTYPES = ("F32", "BF16", "F16")              # safetensors dtypes megavm loads
MAX_JSON_BYTES = 64 << 20


@dataclass
class Checkpoint:
    path: Path
    cfg: ModelConfig
    hf: dict[str, torch.Tensor]      # Hugging Face names -> tensors, all of one dtype (quantized projections: f32,
    #                                  what their codes and scales stand for)
    dtype: str                       # "f32" | "bf16"
    notes: list[str] = field(default_factory=list)
    weights: str = ""                # ScheduleConfig.weights: "fp8", "fp8-block", "nvfp4", "mxfp4" or "int4"


@dataclass
class Header:
    """What the weight files say of the tensors the config implies, their data unread."""
    files: dict[str, Path]           # tensor name -> the file holding it
    dtypes: dict[str, str]           # tensor name -> safetensors dtype ("BF16", ...)


def _json(f: Path, what: str):
    _contained(f.parent, f)
    if not f.is_file():
        raise CheckpointError(f"{f.parent}: no {f.name}; expected {what}")
    if f.stat().st_size > MAX_JSON_BYTES:
        raise CheckpointError(f"{f}: {f.stat().st_size} bytes, more than a {what} holds ({MAX_JSON_BYTES})")
    try:
        return json.loads(f.read_bytes())
    except (ValueError, RecursionError) as e:
        raise CheckpointError(f"{f}: not JSON: {str(e)[:200]}") from None


def read_config(path) -> ModelConfig:
    path = Path(path)
    try:
        return hf_config.parse(_json(path / "config.json", "a Hugging Face model folder"), str(path / "config.json"))
    except ConfigError as e:
        raise CheckpointError(str(e)) from None


def config_dtype(path) -> str:
    """The program dtype that config.json's dtype (torch_dtype before transformers 5) implies, without
    reading the weights; load() decides from the tensors themselves."""
    hf = _json(Path(path) / "config.json", "a Hugging Face model folder")
    return "f32" if (hf.get("dtype") or hf.get("torch_dtype")) == "float32" else "bf16"


def _safe_open():
    try:
        from safetensors import safe_open
    except ImportError:
        raise CheckpointError("reading checkpoints needs the safetensors package: pip install 'megavm[checkpoint]'") \
            from None
    return safe_open


def _contained(path: Path, f: Path) -> Path:
    """f, refused when it is a link to a file outside the folder; a Hugging Face hub snapshot's links
    into its own blobs/ folder are the one exception."""
    if f.is_symlink():
        target, root = f.resolve(), path.resolve()
        if not (target.is_relative_to(root) or target.is_relative_to(root.parent.parent / "blobs")):
            raise CheckpointError(f"{f}: a link to {target}, outside the checkpoint folder")
    return f


def _inside(path: Path, name) -> Path:
    """path / name, refused unless name is a plain file name and the file stays inside the folder."""
    if not isinstance(name, str) or not name or "/" in name or "\\" in name or name in (".", "..") or "\0" in name:
        raise CheckpointError(f"{path / INDEX}: shard {name!r} is not a file name inside the folder")
    return _contained(path, path / name)


def tensor_files(path: Path) -> dict[str, Path]:
    """Tensor name -> the safetensors file holding it (headers only)."""
    if (path / INDEX).is_file():
        index = _json(path / INDEX, "a shard index")
        weight_map = index.get("weight_map") if isinstance(index, dict) else None
        if not isinstance(weight_map, dict) or not all(isinstance(k, str) for k in weight_map):
            raise CheckpointError(f"{path / INDEX}: no 'weight_map' object of tensor names")
        files = {name: _inside(path, f) for name, f in weight_map.items()}
        absent = sorted({str(f) for f in files.values() if not f.is_file()})
        if absent:
            raise CheckpointError(f"{path / INDEX} lists shards that are not there: {absent}")
        return files
    single = _contained(path, path / SINGLE)
    if not single.is_file():
        found = sorted(p.name for p in path.glob("*.safetensors"))
        raise CheckpointError(f"{path}: neither {SINGLE} nor {INDEX}" +
                              (f" (found {found}; a sharded checkpoint needs its index)" if found else ""))
    return {name: single for name in _header(single)}


def _header(file: Path) -> dict[str, tuple[tuple[int, ...], str]]:
    """name -> (shape, dtype) of every tensor in a safetensors file, from its header alone."""
    try:
        with _safe_open()(file, "pt") as f:
            return {name: (tuple(f.get_slice(name).get_shape()), f.get_slice(name).get_dtype()) for name in f.keys()}
    except CheckpointError:
        raise
    except Exception as e:    # the library's SafetensorError, or an OS error reading the file
        raise CheckpointError(f"{file}: not a safetensors file megavm can read: {str(e)[:200]}") from None


def weight_format(path) -> str:
    """"fp8", "fp8-block", "nvfp4", "mxfp4" or "int4" for a folder `megavm quantize` wrote in that format, else "" (read_config
    refuses the rest)."""
    return hf_config.weight_format(_json(Path(path) / "config.json", "config.json"))


def _quant_parts(want: dict[str, tuple[int, ...]], fmt: str) -> dict[str, tuple[tuple[int, ...], str]]:
    """A quantized folder's projection tensors, (shape, dtype) by name: fp8, e4m3 codes of the weight's
    shape and f32 scales [out, 1]; fp8-block, such codes and f32 `weight_scale_inv` [ceil(out/128),
    ceil(in/128)]; nvfp4, code bytes [out, in/2], e4m3 block scales [out, in/16] and an
    f32 global scale []; mxfp4, code bytes `weight_blocks` [out, in/32, 16] and biased exponents
    `weight_scales` [out, in/32] (no `weight`); int4, AWQ's `qweight` I32 [in, out/8], `qzeros` I32
    [in/128, out/8] and f16 `scales` [in/128, out] (no `weight`)."""
    out = {}
    for n, s in want.items():
        if projection(n):
            p = n[:-len("weight")]
            if fmt == "fp8":
                out |= {n: (s, "F8_E4M3"), p + "weight_scale": ((s[0], 1), "F32")}
            elif fmt == "fp8-block":
                out |= {n: (s, "F8_E4M3"), p + "weight_scale_inv": ((-(-s[0] // 128), -(-s[1] // 128)), "F32")}
            elif fmt == "mxfp4":
                out |= {p + "weight_blocks": ((s[0], s[1] // 32, 16), "U8"), p + "weight_scales": ((s[0], s[1] // 32), "U8")}
            elif fmt == "int4":
                out |= {p + "qweight": ((s[1], s[0] // 8), "I32"), p + "qzeros": ((s[1] // 128, s[0] // 8), "I32"),
                        p + "scales": ((s[1] // 128, s[0]), "F16")}
            else:
                out |= {n: ((s[0], s[1] // 2), "U8"), p + "weight_scale": ((s[0], s[1] // 16), "F8_E4M3"),
                        p + "weight_scale_2": ((), "F32")}
    return out


def inspect(path, cfg: ModelConfig | None = None) -> Header:
    """Every tensor cfg (default: config.json's) implies, checked against the files' headers (of a
    quantized folder: each projection in its format's tensors, _quant_parts)."""
    path = Path(path)
    cfg = cfg or read_config(path)
    want = hf_shapes(cfg)
    fmt = weight_format(path)
    parts = _quant_parts(want, fmt) if fmt else {}
    want = {n: s for n, s in want.items() if not (fmt and projection(n))} | {n: s for n, (s, _) in parts.items()}
    files = tensor_files(path)
    missing = [n for n in want if n not in files]
    if missing:
        raise CheckpointError(f"{path}: checkpoint lacks {len(missing)} tensor(s) its config.json implies: "
                              f"{missing[:8]}{' ...' if len(missing) > 8 else ''}")
    headers = {f: _header(f) for f in sorted(set(files[n] for n in want))}
    bad, dtypes = [], {}
    for name, shape in want.items():
        if name not in headers[files[name]]:
            bad.append(f"{name}: not in {files[name].name}, which the index names")
            continue
        got, dtype = headers[files[name]][name]
        if got != shape:
            bad.append(f"{name}: {got}, expected {shape}")
        elif name in parts and dtype != parts[name][1]:
            bad.append(f"{name}: dtype {dtype}; an {fmt} folder holds it as {parts[name][1]}")
        elif name not in parts and dtype not in DTYPES:
            bad.append(f"{name}: dtype {dtype}; megavm loads F32, BF16 or F16")
        dtypes[name] = dtype
    if bad:
        raise CheckpointError(f"{path}: tensor(s) that do not fit config.json: {bad[:8]}")
    return Header({n: files[n] for n in want}, dtypes)


def load(path, dtype: str | None = None) -> Checkpoint:
    """Config, headers, then weights; `dtype` ("f32" | "bf16") overrides the checkpoint's own."""
    path = Path(path)
    cfg = read_config(path)
    header = inspect(path, cfg)
    hf = {}
    for file in sorted(set(header.files.values())):
        names = [n for n, f in header.files.items() if f == file]
        try:
            with _safe_open()(file, "pt") as f:
                hf.update({name: f.get_tensor(name) for name in names})
        except Exception as e:
            raise CheckpointError(f"{file}: reading its tensors failed: {str(e)[:200]}") from None
    fmt = weight_format(path)                    # "" unless a quantized folder (quant.FORMATS)
    if fmt:
        hf = _dequantize(path, hf, fmt)
    nonfinite = [(n, int((~torch.isfinite(t)).sum())) for n, t in hf.items() if not torch.isfinite(t).all()]
    if nonfinite:
        raise CheckpointError(f"{path}: tensor(s) holding NaN or inf: " +
                              ", ".join(f"{n} ({k} values)" for n, k in nonfinite[:8]))
    found = {t.dtype for n, t in hf.items() if not (fmt and projection(n))}
    notes = [{"fp8": "fp8 projections: e4m3 codes with a scale per output row, run as stored",
              "fp8-block": "fp8-block projections: e4m3 codes with a scale per 128 x 128 block, run as stored",
              "nvfp4": "nvfp4 projections: e2m1 codes with an e4m3 scale per 16 and a global scale, run as stored",
              "mxfp4": "mxfp4 projections: e2m1 codes with a power of two (e8m0) per 32, run as stored",
              "int4": "int4 projections: AWQ's 4-bit codes with an f16 scale and a zero point per 128, run as "
                      "stored (codes repacked along rows)"}[fmt]] if fmt else []
    own = "f32" if found == {torch.float32} else "bf16"
    if torch.float16 in found:
        notes.append("float16 checkpoint converted to bfloat16 (programs hold f32 or bf16 weights)")
    if len(found) > 1:
        notes.append(f"mixed dtypes {sorted(str(d) for d in found)} unified to {own}")
    if dtype is not None and dtype != own:
        notes.append(f"{own} checkpoint converted to {dtype} as asked")
    dtype = dtype or own
    tdt = {"f32": torch.float32, "bf16": torch.bfloat16}[dtype]
    # quantized projections stay f32: what their codes and scales stand for (stored() writes them back)
    return Checkpoint(path, cfg, {n: t if fmt and projection(n) else t.to(tdt) for n, t in hf.items()}, dtype,
                      notes, fmt)


def _dequantize(path: Path, hf: dict[str, torch.Tensor], fmt: str) -> dict[str, torch.Tensor]:
    """A quantized folder's codes and scales -> the f32 weights they stand for, naming a NaN code (e4m3
    codes or block scales) or a scale that is not finite and not negative."""
    from megavm.schedule import quant
    out = {}
    for n, t in hf.items():
        if n.endswith((".weight_scale", ".weight_scale_2", ".weight_scales", ".weight_scale_inv", ".qzeros", ".scales")):
            continue
        if n.endswith(".qweight"):                       # int4: AWQ's codes; zero points and f16 scales beside them
            p = n[:-len("qweight")]
            sc = hf[p + "scales"].float()
            if not bool(torch.isfinite(sc).all()) or bool((sc < 0).any()):
                raise CheckpointError(f"{path}: {p}scales holds a scale that is NaN, inf or negative at "
                                      f"{(~torch.isfinite(sc) | (sc < 0)).nonzero()[0].tolist()}")
            out[p + "weight"] = quant.dequantize({"qweight": t, "qzeros": hf[p + "qzeros"], "scales": sc}, "int4")
            continue
        if n.endswith(".weight_blocks"):                 # mxfp4: the weight's codes; its exponents beside them
            p = n[:-len("weight_blocks")]
            e = hf[p + "weight_scales"]
            if bool((e == 255).any()):
                raise CheckpointError(f"{path}: {p}weight_scales holds the NaN exponent 255 at "
                                      f"{(e == 255).nonzero()[0].tolist()}")
            out[p + "weight"] = quant.dequantize({"weight_blocks": t, "weight_scales": e}, "mxfp4")
            continue
        if not projection(n):
            out[n] = t
            continue
        p = n[:-len("weight")]
        scale = "weight_scale_inv" if fmt == "fp8-block" else "weight_scale"
        parts = {"weight": t, scale: hf[p + scale]}
        if fmt == "nvfp4":
            parts["weight_scale_2"] = hf[p + "weight_scale_2"]
        for k, s in parts.items():
            if s.dtype == torch.float32 and (not bool(torch.isfinite(s).all()) or bool((s < 0).any())):
                where = f" (row {int((~torch.isfinite(s) | (s < 0)).nonzero()[0, 0])})" if s.ndim else ""
                raise CheckpointError(f"{path}: {p}{k} holds a scale that is NaN, inf or negative{where}")
            if s.dtype == torch.float8_e4m3fn and (nan := quant.e4m3_nan(s)) is not None:
                raise CheckpointError(f"{path}: {p}{k} holds a NaN code (e4m3 0x7f or 0xff) at {nan}")
        out[n] = quant.dequantize(parts, fmt)
    return out
