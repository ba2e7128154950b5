"""EMB_GATHER: e[b, f] = table[(ids[b, f] + 1) % rows(table)] for the tile's batch rows b: one sparse
feature's embedding lookup, its raw ids (a runtime input, each >= 0) hashed to table rows by the
modulus hash. Only the gathered rows are read; tables may hold millions of rows."""
import torch

from megavm.instructions.batch import B0, NB, batch_rows, check_batch_rows
from megavm.instructions.spec import ACT, F32, I32, INP, SPARSE_ID, Access, OpSpec, Param, Slot, W, full, need

FEATURE = Param("feature", "the sparse feature: column of ids, row of e")


def check(p, ins, outs):
    probs = []
    table, ids = ins
    e = outs[0]
    need(len(table.shape) == 2, probs, f"table must be 2-D, has shape {table.shape}")
    need(len(ids.shape) == 2, probs, f"ids must be [batch, features], has shape {ids.shape}")
    if probs:
        return probs
    B, S = ids.shape
    need(e.shape == (B, S, table.shape[1]), probs, f"e has shape {e.shape}, expected {(B, S, table.shape[1])}")
    need(0 <= p["feature"] < S, probs, f"feature={p['feature']} outside the {S} sparse features")
    check_batch_rows(p, B, probs, "ids")
    return probs


def hashed_rows(ids: torch.Tensor, n_rows: int) -> torch.Tensor:
    """The modulus hash: raw ids (>= 0) -> table rows."""
    return (ids.long() + 1) % n_rows


def reference(p, ins, outs):
    table, ids = ins
    b0, b1 = batch_rows(p)
    raw = ids[b0:b1, p["feature"]]
    if (raw < 0).any():
        raise ValueError(f"EMB_GATHER: negative sparse id {int(raw.min())}")
    outs[0][b0:b1, p["feature"]] = table[hashed_rows(raw, table.shape[0])].float()


SPEC = OpSpec(
    name="EMB_GATHER", code=15, doc=__doc__,
    inputs=(Slot("table", W), Slot("ids", INP, I32, role=SPARSE_ID)),
    outputs=(Slot("e", ACT, F32),),
    params=(FEATURE, B0, NB),
    check=check,
    accesses=lambda p, i, o: [Access("in", 0, full(i[0].shape)), Access("in", 1, full(i[1].shape)),
                              Access("out", 0, (batch_rows(p), (p["feature"], p["feature"] + 1),
                                                (0, o[0].shape[2])))],
    reference=reference,
    shared=lambda p, ins, outs: 0,                 # rows copied from the table straight to e
    cost=lambda p, ins, outs: (p["nb"] * (4 + ins[0].shape[1] * (ins[0].dtype.itemsize + 4)), 0),
)
