"""RMS_LINEAR_ROPE: the query projection tile with RoPE in its epilogue.

Rows are in interleaved-pair layout (row 2i and 2i+1 of a head rotate together), which the model's
weight preparation produces from the usual rotate-half layout; freqs[i] is the inverse frequency of
pair i (Llama-3 scaling already applied).

ROPE (y[rows] = rotate(a[rows])) is the unfused form, for the RoPE/KV-fusion ablation: the projection
writes a plain vector and a ROPE task rotates it.
"""
import torch

from instructions.common import check_vec, check_vec_rows, matvec, norm_input, tile_cost, vector_len
from instructions.rms_linear import check_norm_linear, norm_linear_accesses, row_stream
from instructions.spec import ACT, INP, W, Access, Op, OpSpec, Slot, full, need, rows
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
    y = matvec(w[r0:r1], norm_input(p, x, g))
    outs[0][r0:r1] = rotate_pairs(y, r0, p["head_dim"], int(pos[0]), freqs)


SPEC = OpSpec(
    op=Op.RMS_LINEAR_ROPE,
    inputs=(Slot("x", ACT, (DType.F32,)), Slot("gamma", W), Slot("w", W), Slot("pos", INP, (DType.I32,)),
            Slot("freqs", W, (DType.F32,))),
    outputs=(Slot("y", ACT, (DType.F32,)),),
    params=("row0", "nrows", "eps", "norm", "head_dim"), float_params=frozenset({"eps"}),
    check=check_rope,
    accesses=lambda p, i, o: norm_linear_accesses(p, i, o) + [Access("in", 3, full(i[3])), Access("in", 4, full(i[4]))],
    reference=reference, streams=row_stream,
    cost=lambda p, ins, isz: tile_cost(p, ins[2][1], isz[2]),
)


def check_vec_op(p, ins, rope: bool) -> tuple[list[str], int | None]:
    """ROPE/KV_APPEND: a row range of vector a and the pos operand; with rope, whole row pairs of
    heads of head_dim and freqs of head_dim / 2. -> (problems, a's length or None)."""
    probs = []
    a, pos, freqs = ins
    hd = p["head_dim"]
    n = vector_len(a, probs, "a")
    if n is not None:
        check_vec_rows(p, n, probs)
    need(tuple(pos) == (1,), probs, f"pos has shape {tuple(pos)}, expected (1,)")
    if rope:
        need(hd >= 2 and hd % 2 == 0, probs, f"head_dim={hd} must be even")
        need(p["row0"] % 2 == 0 and p["nrows"] % 2 == 0, probs, "RoPE ranges must hold whole row pairs")
        need(tuple(freqs) == (hd // 2,), probs, f"freqs has shape {tuple(freqs)}, expected ({hd // 2},)")
    return probs, n


def check_rope_op(p, ins, outs):
    probs, n = check_vec_op(p, ins, rope=True)
    if n is not None:
        check_vec(outs[0], n, probs, "y")
    return probs


def reference_rope(p, ins, outs):
    a, pos, freqs = ins
    r0, r1 = p["row0"], p["row0"] + p["nrows"]
    outs[0][r0:r1] = rotate_pairs(a[r0:r1].float(), r0, p["head_dim"], int(pos[0]), freqs)


ROPE = OpSpec(
    op=Op.ROPE,
    inputs=(Slot("a", ACT, (DType.F32,)), Slot("pos", INP, (DType.I32,)), Slot("freqs", W, (DType.F32,))),
    outputs=(Slot("y", ACT, (DType.F32,)),),
    params=("row0", "nrows", "head_dim"), float_params=frozenset(),
    check=check_rope_op,
    accesses=lambda p, i, o: [Access("in", 0, rows(p["row0"], p["row0"] + p["nrows"])), Access("in", 1, full(i[1])),
                              Access("in", 2, full(i[2])), Access("out", 0, rows(p["row0"], p["row0"] + p["nrows"]))],
    reference=reference_rope, streams=lambda p, ins: [],
    cost=lambda p, ins, isz: (8 * p["nrows"], 6 * p["nrows"]),
)
