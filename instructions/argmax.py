"""ARGMAX: the step's next token, the index of the largest logit (ties to the lowest index), from the
(tiles, 2) partials of RMS_LINEAR_ARGMAX; given the (vocab,) logits instead, it scans every logit
itself (the unfused ablation). Under the in-kernel token loop it also feeds the next step."""
import math

import torch

from megavm.instructions.spec import ACT, F32, I32, NEXT_TOKEN, Access, OpSpec, Slot, full, need


def check(p, ins, outs):
    probs = []
    best = ins[0].shape
    need(len(best) == 1 or (len(best) == 2 and best[1] == 2), probs,
         f"best has shape {best}, expected (tiles, 2) partials or a (vocab,) vector of logits")
    need(outs[0].shape == (1,), probs, f"token has shape {outs[0].shape}, expected (1,)")
    return probs


def reference(p, ins, outs):
    best = ins[0]
    if best.dim() == 1:
        outs[0][0] = int(torch.argmax(best))
        return
    j = int(torch.argmax(best[:, 0]))
    outs[0][0] = int(best[j, 1])


SPEC = OpSpec(
    name="ARGMAX", code=9, doc=__doc__,
    shared=lambda p, ins, outs: 0,
    inputs=(Slot("best", ACT, F32),),
    outputs=(Slot("token", ACT, I32, role=NEXT_TOKEN),),
    params=(),
    check=check,
    accesses=lambda p, i, o: [Access("in", 0, full(i[0].shape)), Access("out", 0, ((0, 1),))],
    reference=reference,
    cost=lambda p, ins, outs: (math.prod(ins[0].shape) * 4, 0),
)
