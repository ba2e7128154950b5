"""Mutation fuzzing of the validator: break valid programs in named ways, and check that whatever the
validator still accepts runs without deadlock or race in the ReferenceVM's checking mode.

Valid programs come from lowering the tiny and moe-tiny presets (router, late-bound expert streams;
inline combines, an fp8 KV cache, LoRA adapters on every projection) and from small hand-built graphs
(`small_program`): chains and diamonds of RMS_LINEAR / LINEAR_RESIDUAL tiles behind an EMBED.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field, replace
from typing import Callable

import torch

from megavm.core.errors import DeadlockError, RaceError
from megavm.core.types import BufferKind as K
from megavm.core.types import DType
from megavm.instructions import Op, spec
from megavm.schedule.assign import assign
from megavm.schedule.config import ScheduleConfig
from megavm.schedule.ir import Counter, Program, Task, Wait
from megavm.schedule.lower import lower
from megavm.schedule.models import PRESETS
from megavm.schedule.validate import validate
from megavm.vm.inputs import input_limits
from megavm.vm.pack import pack
from megavm.vm.reference import ReferenceVM

Queues = list[list[int]]
VM_SEEDS = 3                      # interleavings tried per accepted mutant


# -- valid programs -----------------------------------------------------------------------------
@dataclass(frozen=True)
class Node:
    """One stage of a hand-built program: RMS_LINEAR tiles reading one earlier stage, or
    LINEAR_RESIDUAL tiles reading two (a, res); dim is ignored for the latter (res fixes it)."""
    srcs: tuple[int, ...]
    dim: int
    rows: int


def _tiles(n: int, rows: int) -> list[tuple[int, int]]:
    return [(r, min(rows, n - r)) for r in range(0, n, rows)]


def small_program(embed_dim: int, embed_cols: int, nodes: list[Node], vocab: int = 16) -> Program:
    """Stage 0 embeds the token into x.0; stage k >= 1 is nodes[k-1] writing x.k; the last is OUTPUT.
    All sizes must be multiples of 8."""
    p = Program(meta={"inputs": ["token"]})
    p.add_buffer("table", K.WEIGHT, DType.F32, (vocab, embed_dim))
    p.add_buffer("token", K.INPUT, DType.I32, (1,))
    dims, counts = [embed_dim], []
    for node in nodes:
        dims.append(dims[node.srcs[1]] if len(node.srcs) == 2 else node.dim)
    for k, d in enumerate(dims):
        p.add_buffer(f"x.{k}", K.OUTPUT if k == len(nodes) else K.ACTIVATION, DType.F32, (d,))
    c = p.add_counter("x.0")
    tiles = _tiles(embed_dim, embed_cols)
    for c0, n in tiles:
        p.add_task(Task(Op.EMBED, (0, 1), (p.buffer_id("x.0"),), (), c, {"col0": c0, "ncols": n, "scale": 1.0}, f"embed[{c0}]"))
    counts.append(len(tiles))
    for k, node in enumerate(nodes, 1):
        x = p.buffer_id(f"x.{node.srcs[0]}")
        kdim = dims[node.srcs[0]]
        if len(node.srcs) == 1:
            g = p.add_buffer(f"gamma.{k}", K.WEIGHT, DType.F32, (kdim,))
            w = p.add_buffer(f"w.{k}", K.WEIGHT, DType.F32, (dims[k], kdim))
            op, ins, extra = Op.RMS_LINEAR, (x, g, w), {"eps": 1e-5, "norm": 1}
        else:
            w = p.add_buffer(f"w.{k}", K.WEIGHT, DType.F32, (dims[k], kdim))
            op, ins, extra = Op.LINEAR_RESIDUAL, (x, w, p.buffer_id(f"x.{node.srcs[1]}")), {}
        waits = tuple(Wait(s, counts[s]) for s in sorted(set(node.srcs)))
        c = p.add_counter(f"x.{k}")
        tiles = _tiles(dims[k], node.rows)
        for r0, n in tiles:
            p.add_task(Task(op, ins, (p.buffer_id(f"x.{k}"),), waits, c, {"row0": r0, "nrows": n, **extra},
                            f"x{k}[{r0}]"))
        counts.append(len(tiles))
    return p


def shuffled(program: Program, rng: random.Random) -> Program:
    """The same program in another topological order, picked at random."""
    prod = program.producers()
    left = {i: sum(len(prod[w.counter]) for w in t.waits) for i, t in enumerate(program.tasks)}
    waiters: dict[int, list[int]] = {}
    for i, t in enumerate(program.tasks):
        for w in t.waits:
            waiters.setdefault(w.counter, []).append(i)
    ready = [i for i, n in left.items() if n == 0]
    order = []
    while ready:
        i = ready.pop(rng.randrange(len(ready)))
        order.append(i)
        for j in waiters.get(program.tasks[i].signal, []):
            left[j] -= 1
            if left[j] == 0:
                ready.append(j)
    return replace(program, tasks=[program.tasks[i] for i in order])


def random_queues(program: Program, n_sms: int, rng: random.Random) -> Queues:
    """Each task, in program order, appended to a random SM's queue."""
    queues: Queues = [[] for _ in range(n_sms)]
    for i in range(len(program.tasks)):
        queues[rng.randrange(n_sms)].append(i)
    return queues


def random_program(rng: random.Random) -> Program:
    nodes = []
    for k in range(1, rng.randint(2, 6)):
        srcs = (rng.randrange(k), rng.randrange(k)) if k > 1 and rng.random() < 0.4 else (rng.randrange(k),)
        nodes.append(Node(srcs, rng.choice((8, 16, 24)), rng.randint(1, 24)))
    d0 = rng.choice((8, 16, 24))
    return shuffled(small_program(d0, rng.randint(1, d0), nodes), rng)


# -- mutations: each returns (program, queues, what it did), or None where it does not apply ------
Mutant = tuple[Program, Queues, str]


def _with_task(p: Program, i: int, **changes) -> Program:
    tasks = list(p.tasks)
    tasks[i] = replace(tasks[i], **changes)
    return replace(p, tasks=tasks)


def _pick_wait(p: Program, rng: random.Random):
    waits = [(i, k) for i, t in enumerate(p.tasks) for k in range(len(t.waits))]
    return rng.choice(waits) if waits else None


def drop_wait(p: Program, q: Queues, rng: random.Random) -> Mutant | None:
    if (pick := _pick_wait(p, rng)) is None:
        return None
    i, k = pick
    waits = p.tasks[i].waits
    return _with_task(p, i, waits=waits[:k] + waits[k + 1:]), q, f"{p.describe_task(i)} no longer waits {waits[k]}"


def lower_threshold(p: Program, q: Queues, rng: random.Random) -> Mutant | None:
    if (pick := _pick_wait(p, rng)) is None:
        return None
    i, k = pick
    w = p.tasks[i].waits[k]
    if w.threshold < 1:
        return None
    waits = list(p.tasks[i].waits)
    waits[k] = Wait(w.counter, rng.randrange(w.threshold))
    return _with_task(p, i, waits=tuple(waits)), q, f"{p.describe_task(i)}: {w} -> {waits[k]}"


def raise_threshold(p: Program, q: Queues, rng: random.Random) -> Mutant | None:
    if (pick := _pick_wait(p, rng)) is None:
        return None
    i, k = pick
    w = p.tasks[i].waits[k]
    waits = list(p.tasks[i].waits)
    waits[k] = Wait(w.counter, len(p.producers()[w.counter]) + rng.randint(1, 3))
    return _with_task(p, i, waits=tuple(waits)), q, f"{p.describe_task(i)}: {w} -> {waits[k]}"


def back_edge(p: Program, q: Queues, rng: random.Random) -> Mutant | None:
    later = [j for j, t in enumerate(p.tasks) if j > 0 and t.signal >= 0]
    if not later:
        return None
    j = rng.choice(later)
    i, c = rng.randrange(j), p.tasks[j].signal
    w = Wait(c, len(p.producers()[c]))
    return _with_task(p, i, waits=p.tasks[i].waits + (w,)), q, f"{p.describe_task(i)} waits {w}, signalled by task {j}"


def unordered_writer(p: Program, q: Queues, rng: random.Random) -> Mutant | None:
    """A copy of a writer with the same waits, signalling nothing or a fresh counter, right after it
    (in its queue: an inline task, in none, is not picked)."""
    i = rng.choice([j for j, t in enumerate(p.tasks) if not t.inline])
    counters = list(p.counters)
    signal = -1
    if rng.random() < 0.5:
        counters.append(Counter(f"fuzz.copy.{i}"))
        signal = len(counters) - 1
    tasks = p.tasks[:i + 1] + [replace(p.tasks[i], signal=signal, label=p.tasks[i].label + ".copy")] + p.tasks[i + 1:]
    shift = [[t + (t > i) for t in queue] for queue in q]
    home = next(k for k, queue in enumerate(shift) if i in queue)
    shift[home].insert(shift[home].index(i) + 1, i + 1)
    return replace(p, counters=counters, tasks=tasks), shift, f"copy of {p.describe_task(i)} as task {i + 1}"


def queue_before_producer(p: Program, q: Queues, rng: random.Random) -> Mutant | None:
    """Move a task into its producer's queue, just ahead of the producer (an inline producer has no queue)."""
    prod = p.producers()
    queued = {t for queue in q for t in queue}
    pairs = [(i, j) for i, t in enumerate(p.tasks) for w in t.waits for j in prod[w.counter]
             if j != i and j in queued]
    if not pairs:
        return None
    i, j = rng.choice(pairs)
    queues = [[t for t in queue if t != i] for queue in q]
    home = next(k for k, queue in enumerate(queues) if j in queue)
    queues[home].insert(queues[home].index(j), i)
    return p, queues, f"{p.describe_task(i)} queued ahead of its producer task {j} in queue {home}"


def write_weight(p: Program, q: Queues, rng: random.Random) -> Mutant | None:
    weights = p.buffers_of_kind(K.WEIGHT)
    i = rng.randrange(len(p.tasks))
    t = p.tasks[i]
    if not weights or not t.outputs:
        return None
    k = rng.randrange(len(t.outputs))
    same = [b for b in weights if p.buffers[b].shape == p.buffers[t.outputs[k]].shape]
    b = rng.choice(same or weights)
    outs = t.outputs[:k] + (b,) + t.outputs[k + 1:]
    return _with_task(p, i, outputs=outs), q, f"{p.describe_task(i)} output {k} -> {p.buffers[b].name!r}"


def wrong_shape(p: Program, q: Queues, rng: random.Random) -> Mutant | None:
    """Point an operand at a buffer of another shape, preferring one its slot takes whose shape
    differs in rank or in every axis."""
    i = rng.randrange(len(p.tasks))
    t, s = p.tasks[i], spec(p.tasks[i].opcode)
    ops = list(t.inputs + t.outputs)
    present = [j for j, b in enumerate(ops) if b >= 0]          # an empty optional slot has no shape
    k = rng.choice(present)
    slot, cur = (s.inputs + s.outputs)[k], p.buffers[ops[k]].shape
    other = [b for b, buf in enumerate(p.buffers) if buf.shape != cur]
    fits = [b for b in other if p.buffers[b].kind in slot.kinds and p.buffers[b].dtype in slot.dtypes]
    far = [b for b in fits
           if len(p.buffers[b].shape) != len(cur) or all(x != y for x, y in zip(p.buffers[b].shape, cur))]
    if not other:
        return None
    ops[k] = rng.choice(far or fits or other)
    n = len(t.inputs)
    return (_with_task(p, i, inputs=tuple(ops[:n]), outputs=tuple(ops[n:])), q,
            f"{p.describe_task(i)} operand {slot.name!r} -> {p.buffers[ops[k]].name!r}")


def expert_ids_early(p: Program, q: Queues, rng: random.Random) -> Mutant | None:
    """An expert task's wait on the router choice (ROUTE) moved to the router's logits instead: its
    loader would read the expert ids before ROUTE writes them (for EXPERT_DOWN the ids are still
    ordered by its other wait, which the loader does not take)."""
    prod = p.producers()
    picks = []
    for i, t in enumerate(p.tasks):
        if t.opcode in (Op.EXPERT_GLU, Op.EXPERT_DOWN):
            for k, w in enumerate(t.waits):
                routes = [j for j in prod[w.counter] if p.tasks[j].opcode == Op.ROUTE]
                if routes and p.tasks[routes[0]].waits:
                    picks.append((i, k, p.tasks[routes[0]].waits[0]))
    if not picks:
        return None
    i, k, earlier = rng.choice(picks)
    waits = list(p.tasks[i].waits)
    old, waits[k] = waits[k], replace(earlier, polled=False)   # a counter wait: the logits are not read
    return _with_task(p, i, waits=tuple(waits)), q, f"{p.describe_task(i)}: {old} -> {earlier} (the router's logits)"


def history_early(p: Program, q: Queues, rng: random.Random) -> Mutant | None:
    """An attention partial's wait that covers the writers of its K/V history swapped for another
    partial's wait on a different counter: its loader would copy those rows, a step on, before they
    are written (the validator's history rule)."""
    partials = [i for i, t in enumerate(p.tasks) if t.opcode == Op.ATTN_PARTIAL]
    picks = []
    for i in partials:
        t = p.tasks[i]
        hist = [st for st in spec(t.opcode).streams(t.params, *p.operands(i)) if st.window is not None]
        if not hist or (k := p.history_wait(i, hist[0])) is None:
            continue
        for j in partials:
            w = p.tasks[j].waits[0] if p.tasks[j].waits else None
            if w is not None and w.counter not in {x.counter for x in t.waits}:
                picks.append((i, k, w, hist[0], p.tasks[j].label.split(".")[0] == t.label.split(".")[0]))
    rng.shuffle(picks)
    picks.sort(key=lambda x: not x[4])           # another head of the same layer first: no cycle, only the history
    for i, k, other, st, _ in picks:
        waits = list(p.tasks[i].waits)
        old, waits[k] = waits[k], other
        m = _with_task(p, i, waits=tuple(waits))
        if m.history_wait(i, st) is None:
            return m, q, f"{p.describe_task(i)}: {old} -> {other} (another head's wait)"
    return None


def inline_early(p: Program, q: Queues, rng: random.Random) -> Mutant | None:
    """A task of one all-join wait that streams nothing, made inline (out of its queue) with its
    threshold one short: its second-to-last signaller would run it before the last producer is done
    (the validator's all_join rule)."""
    picks = [i for i, t in enumerate(p.tasks) if len(t.waits) == 1 and t.waits[0].threshold > 1
             and not spec(t.opcode).streams(t.params, *p.operands(i))]
    if not picks:
        return None
    i = rng.choice(picks)
    w = p.tasks[i].waits[0]
    m = _with_task(p, i, inline=True, waits=(Wait(w.counter, w.threshold - 1),))
    what = f"{p.describe_task(i)}: inline, {w} -> threshold {w.threshold - 1}"
    return m, [[j for j in queue if j != i] for queue in q], what


def amax_early(p: Program, q: Queues, rng: random.Random) -> Mutant | None:
    """The quantization seed's bug: a KV_QUANT task's wait on the tiles that write the amax partials
    lowered below their count (to 1, or one short), so it may reduce the partials, take the scale and
    quantize before the last tile has written its amax (the validator's race rule)."""
    picks = [i for i, t in enumerate(p.tasks) if t.opcode == Op.KV_QUANT and t.waits[0].threshold > 1]
    if not picks:
        return None
    i = rng.choice(picks)
    w = p.tasks[i].waits[0]
    low = rng.choice([1, w.threshold - 1])
    return (_with_task(p, i, waits=(Wait(w.counter, low),) + p.tasks[i].waits[1:]), q,
            f"{p.describe_task(i)}: {w} -> threshold {low} (amax partials read early)")


def poll_uncovered(p: Program, q: Queues, rng: random.Random) -> Mutant | None:
    """A counter wait marked polled although its producers write no tagged word the task reads (the
    attention partial's wait on its head's q/k/v tiles): on the GPU the task would start at once."""
    picks = [(i, k) for i, t in enumerate(p.tasks) for k, w in enumerate(t.waits)
             if not w.polled and not t.inline and not any(p.buffers[b].tagged for b in t.inputs if b >= 0)]
    if not picks:
        return None
    i, k = rng.choice(picks)
    waits = list(p.tasks[i].waits)
    waits[k] = replace(waits[k], polled=True)
    return _with_task(p, i, waits=tuple(waits)), q, f"{p.describe_task(i)}: wait {k} polled, covering nothing"


def untag_read(p: Program, q: Queues, rng: random.Random) -> Mutant | None:
    """A tagged buffer that a polled wait relies on, stored plain while its readers' waits stay polled:
    nothing would hold them until their producers are done."""
    prod = p.producers()
    picks = sorted({b for t in p.tasks for w in t.waits if w.polled for b in t.inputs
                    if b >= 0 and p.buffers[b].tagged and any(b in p.tasks[j].outputs for j in prod[w.counter])})
    if not picks:
        return None
    b = rng.choice(picks)
    buffers = list(p.buffers)
    buffers[b] = replace(buffers[b], tagged=False)
    return replace(p, buffers=buffers), q, f"buffer {p.buffers[b].name!r} untagged, its readers still polling"


MUTATIONS: dict[str, Callable[[Program, Queues, random.Random], Mutant | None]] = {
    f.__name__: f for f in (drop_wait, lower_threshold, raise_threshold, back_edge, unordered_writer,
                            queue_before_producer, write_weight, wrong_shape, expert_ids_early, history_early,
                            inline_early, amax_early, poll_uncovered, untag_read)}


# -- the fuzzer ---------------------------------------------------------------------------------
@dataclass
class FuzzResult:
    made: int = 0
    rejected: int = 0
    accepted: int = 0
    unsafe_accepted: int = 0
    by_kind: dict[str, dict[str, int]] = field(default_factory=dict)   # kind -> made/rejected/accepted/unsafe
    unsafe: list[str] = field(default_factory=list)                    # what each unsafe mutant did

    def __str__(self) -> str:
        rows = [f"{k:22s} " + " ".join(f"{n}={v}" for n, v in d.items()) for k, d in self.by_kind.items()]
        return (f"{self.made} mutants: {self.rejected} rejected, {self.accepted} accepted, "
                f"{self.unsafe_accepted} unsafe accepted\n  " + "\n  ".join(rows + self.unsafe))


def random_weights(program: Program, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {b.name: (0.3 * torch.randn(b.shape, generator=g)).to(b.dtype.torch)
            for b in program.buffers if b.kind == K.WEIGHT}


def run_checked(program: Program, queues: Queues, weights: dict, rng: random.Random) -> str | None:
    """Run one step under VM_SEEDS seeded interleavings in checking mode; the error, if any."""
    try:
        packed = pack(program, queues)
        limits = input_limits(packed)
        inputs = {b.name: rng.randrange(limits.get(b.name, ("", 1))[1])
                  for b in program.buffers if b.kind == K.INPUT}
        for _ in range(VM_SEEDS):
            ReferenceVM(packed, weights, check=True, seed=rng.randrange(1 << 30)).step(inputs)
    except (DeadlockError, RaceError, ValueError) as e:
        return f"{type(e).__name__}: {e}"
    return None


def _bases(rng: random.Random) -> list[tuple[Program, Queues, dict]]:
    out = []
    for n_sms, strategy, dtype in ((2, "balanced", "f32"), (4, "round_robin", "bf16"), (8, "balanced", "f32")):
        p = lower(PRESETS["tiny"], ScheduleConfig(dtype=dtype, capacity=32, n_sms=n_sms))
        out.append((p, assign(p, n_sms, strategy), random_weights(p, n_sms)))
    p = lower(PRESETS["moe-tiny"], ScheduleConfig(dtype="f32", capacity=32, n_sms=4))    # late-bound expert streams
    out.append((p, assign(p, 4, "balanced"), random_weights(p, 4)))
    p = lower(PRESETS["tiny"], ScheduleConfig(dtype="f32", capacity=32, n_sms=4, inline_combine=True))   # inline tasks
    out.append((p, assign(p, 4, "balanced"), random_weights(p, 4)))
    p = lower(PRESETS["tiny"], ScheduleConfig(dtype="f32", capacity=32, n_sms=4, kv_cache="fp8"))   # amax -> quantize
    out.append((p, assign(p, 4, "balanced"), random_weights(p, 4)))
    p = lower(PRESETS["tiny"], ScheduleConfig(dtype="f32", capacity=32, n_sms=4, lora_adapters=2, lora_rank=4,
                                              lora_targets=("q", "k", "v", "o", "gate", "up", "down")))   # LORA_A
    out.append((p, assign(p, 4), random_weights(p, 4)))
    for k in range(5):
        p = random_program(rng)
        out.append((p, random_queues(p, rng.randint(1, 4), rng), random_weights(p, k)))
    return out


def fuzz(n_programs: int, seed: int = 0) -> FuzzResult:
    rng = random.Random(seed)
    bases = _bases(rng)
    res = FuzzResult(by_kind={k: dict(made=0, rejected=0, accepted=0, unsafe=0) for k in MUTATIONS})
    kinds = list(MUTATIONS)
    for n in range(n_programs):
        kind = kinds[n % len(kinds)]
        mutant = None
        for _ in range(100):
            program, queues, weights = rng.choice(bases)
            if (mutant := MUTATIONS[kind](program, queues, rng)) is not None:
                break
        if mutant is None:
            continue
        program, queues, what = mutant
        counts = res.by_kind[kind]
        res.made += 1
        counts["made"] += 1
        if not validate(program, queues).ok:
            res.rejected += 1
            counts["rejected"] += 1
            continue
        res.accepted += 1
        counts["accepted"] += 1
        err = run_checked(program, queues, weights, rng)
        if err is not None:
            res.unsafe_accepted += 1
            counts["unsafe"] += 1
            res.unsafe.append(f"{kind}: {what}: {err}")
    return res
