"""SAMPLE: the step's next token drawn from the logits: temperature, top-k and top-p with one uniform
draw of Philox4x64-10 keyed by the seed at the step's position (instructions/sampling.py is the
specification). Temperature 0 is greedy, from the LM-head tiles' (max, index) partials as ARGMAX. With
top_k > 0 the candidates are the logits at or above the k-th best tile maximum (every element of the top k
is), gathered into shared memory in one pass and ranked there by counting (past SAMPLE_CANDIDATES of them,
by k block-wide passes, each taking the first element after the last pick); with top_k 0 (and top_p 1) the
draw walks every logit in id order, its sums in f64. Under the in-kernel token loop the token also feeds
the next step."""
import math

from megavm.core.limits import CONSUMER_THREADS, SAMPLE_CANDIDATES
from megavm.instructions.sampling import sample_at
from megavm.instructions.spec import (
    ACT,
    F32,
    I32,
    INP,
    NEXT_TOKEN,
    POSITION,
    SAMPLING,
    SEED,
    Access,
    OpSpec,
    Param,
    Slot,
    full,
    need,
)

def check(p, ins, outs):
    probs = []
    logits, best, params, seed, pos = ins
    need(len(logits.shape) == 1, probs, f"logits must be a vector, has shape {logits.shape}")
    need(len(best.shape) == 2 and best.shape[1] == 2, probs, f"best has shape {best.shape}, expected (tiles, 2)")
    need(params.shape == (3,), probs, f"sampling has shape {params.shape}, expected (3,): temperature, top_k, top_p")
    need(seed.shape == (1,) and pos.shape == (1,), probs, "seed and pos must be scalars (1,)")
    need(outs[0].shape == (1,), probs, f"token has shape {outs[0].shape}, expected (1,)")
    if not probs:
        v, tiles, r = logits.shape[0], best.shape[0], p["tile_rows"]
        need(r >= 1 and math.ceil(v / r) == tiles, probs, f"tile_rows={r}: {tiles} tiles of the {v} logits expected")
        need(tiles <= 1024, probs, f"{tiles} LM-head tiles: SAMPLE ranks at most 1024 tile maxima")
    return probs


def shared(p, ins, outs) -> int:
    """Floats of xs (sample.cuh): the LM-head tiles' maxima, then a count, the candidates' values and ids
    and the tiles that reach the top-k threshold; or the every-token draw's f64 chunk sums and prefixes,
    its chunk and target (8 per consumer thread)."""
    tiles = ins[1].shape[0]
    return max(8 * CONSUMER_THREADS, -(-tiles // 4) * 4 + 4 + 2 * SAMPLE_CANDIDATES + tiles)


def reference(p, ins, outs):
    logits, best, params, seed, pos = ins
    t, k, top_p = (float(x) for x in params)
    outs[0][0] = sample_at(logits, t, int(k), top_p, int(seed[0]), int(pos[0]))


SPEC = OpSpec(
    name="SAMPLE", code=20, doc=__doc__,
    inputs=(Slot("logits", ACT, F32), Slot("best", ACT, F32), Slot("sampling", INP, F32, role=SAMPLING),
            Slot("seed", INP, I32, role=SEED), Slot("pos", INP, I32, role=POSITION)),
    outputs=(Slot("token", ACT, I32, role=NEXT_TOKEN),),
    params=(Param("tile_rows", "rows of each LM-head tile (tile t holds logits [t tile_rows, (t + 1) tile_rows))"),),
    check=check,
    accesses=lambda p, i, o: [Access("in", 0, full(i[0].shape)), Access("in", 1, full(i[1].shape)),
                              Access("out", 0, ((0, 1),))],
    reference=reference, shared=shared,
    cost=lambda p, ins, outs: (ins[0].shape[0] * 4 + math.prod(ins[1].shape) * 4, 0),
)
