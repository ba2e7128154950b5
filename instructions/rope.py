"""RMS_LINEAR_ROPE: the query projection tile with RoPE in its epilogue.

Rows are in interleaved-pair layout (row 2i and 2i+1 of a head rotate together), which the model's
weight preparation produces from the usual rotate-half layout; freqs[i] is the inverse frequency of
pair i (Llama-3 scaling already applied).
"""
import torch

from instructions.common import matvec, rms_normed
from instructions.rms_linear import check_norm_linear, norm_linear_accesses, row_stream
from instructions.common import tile_cost
from instructions.spec import ACT, INP, W, Access, Op, OpSpec, Slot, full, need
from schedule.ir import DType


def rotate_pairs(y: torch.Tensor, row0: int, head_dim: int, pos: int, freqs: torch.Tensor) -> torch.Tensor:
    """y: [n] f32 rows row0.. of interleaved heads -> rotated copy."""
    n = y.shape[0]
    pair = (torch.arange(row0, row0 + n, 2, device=y.device) % head_dim) // 2
    ang = pos * freqs.float()[pair]
    c, s = torch.cos(ang), torch.sin(ang)
    a, b = y[0::2], y[1::2]
    out = torch.empty_like(y)
    out[0::2] = a * c - b * s
    out[1::2] = b * c + a * s
    return out


def check_rope(p, ins, outs):
    probs = check_norm_linear(p, ins[:3], outs, ins[2][0] if len(ins[2]) == 2 else None)
    hd = p["head_dim"]
    need(hd >= 2 and hd % 2 == 0, probs, f"head_dim={hd} must be even")
    need(p["row0"] % 2 == 0 and p["nrows"] % 2 == 0, probs, "RoPE tiles must hold whole row pairs")
    need(tuple(ins[3]) == (1,), probs, f"pos has shape {tuple(ins[3])}, expected (1,)")
    need(tuple(ins[4]) == (hd // 2,), probs, f"freqs has shape {tuple(ins[4])}, expected ({hd // 2},)")
    return probs


def reference(p, ins, outs):
    x, g, w, pos, freqs = ins
    r0, r1 = p["row0"], p["row0"] + p["nrows"]
    y = matvec(w[r0:r1], rms_normed(x, g, p["eps"]))
    outs[0][r0:r1] = rotate_pairs(y, r0, p["head_dim"], int(pos[0]), freqs)


SPEC = OpSpec(
    op=Op.RMS_LINEAR_ROPE,
    inputs=(Slot("x", ACT, (DType.F32,)), Slot("gamma", W), Slot("w", W), Slot("pos", INP, (DType.I32,)),
            Slot("freqs", W, (DType.F32,))),
    outputs=(Slot("y", ACT, (DType.F32,)),),
    params=("row0", "nrows", "eps", "head_dim"), float_params=frozenset({"eps"}),
    check=check_rope,
    accesses=lambda p, i, o: norm_linear_accesses(p, i, o) + [Access("in", 3, full(i[3])), Access("in", 4, full(i[4]))],
    reference=reference, streams=row_stream,
    cost=lambda p, ins, isz: tile_cost(p, ins[2][1], isz[2]),
)
