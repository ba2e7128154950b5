"""EMBED: x[col0:col0+ncols] = table[token, col0:col0+ncols] (the token is a runtime input)."""
from instructions.spec import ACT, INP, W, Access, Op, OpSpec, Slot, full, need, rows
from schedule.ir import DType


def check(p, ins, outs):
    probs = []
    table, tok, x = ins[0], ins[1], outs[0]
    need(len(table) == 2, probs, f"table must be 2-D, has shape {tuple(table)}")
    if probs:
        return probs
    d = table[1]
    need(tuple(tok) == (1,), probs, f"token has shape {tuple(tok)}, expected (1,)")
    need(tuple(x) == (d,), probs, f"x has shape {tuple(x)}, expected ({d},)")
    need(p["ncols"] >= 1 and 0 <= p["col0"] and p["col0"] + p["ncols"] <= d, probs,
         f"cols [{p['col0']}, {p['col0'] + p['ncols']}) outside embedding width {d}")
    return probs


def accesses(p, ins, outs):
    return [Access("in", 0, full(ins[0])), Access("in", 1, full(ins[1])),
            Access("out", 0, rows(p["col0"], p["col0"] + p["ncols"]))]


def reference(p, ins, outs):
    table, token = ins
    t = int(token[0])
    if not 0 <= t < table.shape[0]:
        raise ValueError(f"EMBED: token id {t} outside vocabulary of {table.shape[0]}")
    c0, c1 = p["col0"], p["col0"] + p["ncols"]
    outs[0][c0:c1] = table[t, c0:c1].float()


SPEC = OpSpec(
    op=Op.EMBED,
    inputs=(Slot("table", W), Slot("token", INP, (DType.I32,))),
    outputs=(Slot("x", ACT, (DType.F32,)),),
    params=("col0", "ncols"), float_params=frozenset(),
    check=check, accesses=accesses, reference=reference,
    streams=lambda p, ins: [],
    cost=lambda p, ins, isz: (p["ncols"] * (isz[0] + 4), 0),
)
