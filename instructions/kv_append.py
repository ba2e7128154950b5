"""KV_APPEND: rows of a vector, with their bias and per-head norm where present (instructions/qkv.py),
rotated for keys, appended to the KV cache at position pos (instructions/kv_cache.py): the unfused form
of RMS_LINEAR_KV's epilogue, and the task that finishes k tiles too short for a whole-head norm (Qwen3's
k_norm). With `row`, it also writes the rows as appended, in f32, to that vector (tagged: this step's
attention partials read their own row there, as from RMS_LINEAR_KV's, docs/ir.md)."""
from megavm.instructions.kv_cache import ROPE, append, cache_box, check_cache
from megavm.instructions.qkv import EPILOGUE, FINISH_PREWAIT, HEAD_EPS, check_finish, epilogue, epilogue_accesses
from megavm.instructions.rotary import HEAD_DIM, check_freqs, check_pairs, check_pos, check_vector_range
from megavm.instructions.spec import ACT, F32, I32, INP, KV, POSITION, Access, OpSpec, Slot, W, full, rows
from megavm.instructions.tiles import NROWS, ROW0, tile


def check(p, ins, outs):
    probs = []
    n = check_vector_range(p, ins[0], probs)
    check_pos(ins[1], probs)
    if p["rope"] == 1:
        check_pairs(p, probs, "ranges")
        check_freqs(p, ins[2], probs)
    check_cache(p, outs[0], n, probs, "a has {} elements")
    if n is not None:
        check_finish(p, ins[3], ins[4], n, probs)
    row = outs[1] if len(outs) > 1 else None
    if row is not None and n is not None and row.shape != (n,):
        probs.append(f"row has shape {row.shape}, expected ({n},): a's")
    return probs


def reference(p, ins, outs):
    a, pos, freqs, bias, head_norm = ins
    r0, r1 = tile(p)
    y = append(p, epilogue(p, a[r0:r1].float(), bias, head_norm), int(pos[0]), freqs, outs[0], "KV_APPEND")
    if len(outs) > 1 and outs[1] is not None:      # the rows as appended, in f32, for this step's partials
        outs[1][r0:r1] = y


SPEC = OpSpec(
    name="KV_APPEND", code=14, doc=__doc__,
    shared=lambda p, ins, outs: 2 * p["head_dim"] + p["nrows"],
    inputs=(Slot("a", ACT, F32, tagged=True), Slot("pos", INP, I32, role=POSITION, bound=("cache", 1)), Slot("freqs", W, F32))
    + EPILOGUE,
    outputs=(Slot("cache", KV), Slot("row", ACT, F32, optional=True, tagged=True)),
    params=(ROW0, NROWS, HEAD_DIM, ROPE, HEAD_EPS),
    check=check,
    accesses=lambda p, i, o: [Access("in", 0, rows(*tile(p))), Access("in", 1, full(i[1].shape)),
                              Access("in", 2, full(i[2].shape)), Access("out", 0, cache_box(p, o[0]))]
                             + epilogue_accesses(p, i, 3)
                             + ([Access("out", 1, rows(*tile(p)))] if len(o) > 1 and o[1] is not None else []),
    reference=reference, prewait=FINISH_PREWAIT,
    cost=lambda p, ins, outs: (4 * p["nrows"], 6 * p["nrows"]),
)
