"""RMS_LINEAR_ARGMAX and ARGMAX: LM-head tiles emit their logits and a (max, index) partial; ARGMAX
picks the winner. Ties go to the lowest index, as torch.argmax does.

Given a vector of logits instead of the (tiles, 2) partials, ARGMAX scans every logit itself: the
unfused ablation, after plain RMS_LINEAR LM-head tiles."""
import math

import torch

from instructions.common import matvec, norm_input, tile_cost
from instructions.rms_linear import check_norm_linear, norm_linear_accesses, row_stream
from instructions.spec import ACT, W, Access, Op, OpSpec, Slot, full, need
from schedule.ir import DType


def check_tile(p, ins, outs):
    probs = check_norm_linear(p, ins, outs[:1], ins[2][0] if len(ins[2]) == 2 else None)
    best = tuple(outs[1])
    need(len(best) == 2 and best[1] == 2, probs, f"best has shape {best}, expected (tiles, 2)")
    if len(best) == 2:
        need(0 <= p["tile"] < best[0], probs, f"tile={p['tile']} outside {best[0]} partial slots")
    return probs


def reference_tile(p, ins, outs):
    x, g, w = ins
    r0, r1 = p["row0"], p["row0"] + p["nrows"]
    y = matvec(w[r0:r1], norm_input(p, x, g))
    outs[0][r0:r1] = y
    i = int(torch.argmax(y))
    outs[1][p["tile"], 0] = y[i]
    outs[1][p["tile"], 1] = float(r0 + i)


def check_argmax(p, ins, outs):
    probs = []
    need(len(ins[0]) == 1 or (len(ins[0]) == 2 and ins[0][1] == 2), probs,
         f"best has shape {tuple(ins[0])}, expected (tiles, 2) partials or a (vocab,) vector of logits")
    need(tuple(outs[0]) == (1,), probs, f"token has shape {tuple(outs[0])}, expected (1,)")
    return probs


def reference_argmax(p, ins, outs):
    best = ins[0]
    if best.dim() == 1:
        outs[0][0] = int(torch.argmax(best))
        return
    j = int(torch.argmax(best[:, 0]))
    outs[0][0] = int(best[j, 1])


TILE = OpSpec(
    op=Op.RMS_LINEAR_ARGMAX,
    inputs=(Slot("x", ACT, (DType.F32,)), Slot("gamma", W), Slot("w", W)),
    outputs=(Slot("logits", ACT, (DType.F32,)), Slot("best", ACT, (DType.F32,))),
    params=("row0", "nrows", "eps", "norm", "tile"), float_params=frozenset({"eps"}),
    check=check_tile,
    accesses=lambda p, i, o: norm_linear_accesses(p, i, o) + [Access("out", 1, ((p["tile"], p["tile"] + 1), (0, 2)))],
    reference=reference_tile, streams=row_stream,
    cost=lambda p, ins, isz: tile_cost(p, ins[2][1], isz[2]),
)

ARGMAX = OpSpec(
    op=Op.ARGMAX,
    inputs=(Slot("best", ACT, (DType.F32,)),),
    outputs=(Slot("token", ACT, (DType.I32,)),),
    params=(), float_params=frozenset(),
    check=check_argmax,
    accesses=lambda p, i, o: [Access("in", 0, full(i[0])), Access("out", 0, ((0, 1),))],
    reference=reference_argmax, streams=lambda p, ins: [],
    cost=lambda p, ins, isz: (math.prod(ins[0]) * 4, 0),
)
