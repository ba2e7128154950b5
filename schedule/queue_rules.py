"""The validator's rules on where tasks run: inline tasks (run by their last signaller) and the per-SM
queues. The program's own rules are in schedule/rules.py; schedule/validate.py runs both in order."""
from __future__ import annotations

from typing import Iterator

import numpy as np

from megavm.instructions import spec
from megavm.schedule.happens import find_cycles
from megavm.schedule.rules import Facts, describe_cycle


def inline(f: Facts) -> Iterator[str]:
    """An inline task runs where its one wait completes (the last signal of its counter in a step, an
    all-join by rule all_join), in the signalling task's slot. The loader walks queues only, so it
    streams no weights; the kernel finds it by its counter (args.inline_of), one per counter."""
    first: dict[int, int] = {}                       # counter -> the first inline task waiting on it
    for i, t in enumerate(f.p.tasks):
        if not t.inline:
            continue
        if t.waits and first.setdefault(t.waits[0].counter, i) != i:
            yield (f"{f.who(i)} is inline on {f.ctr(t.waits[0].counter)}, as {f.who(first[t.waits[0].counter])} is: "
                   f"a counter's last signal runs at most one inline task")
        if len(t.waits) != 1:
            yield f"{f.who(i)} is inline: it needs exactly one wait (its last signaller's), not {len(t.waits)}"
        if any(True for _ in spec(t.opcode).streams(t.params, *f.p.operands(i))):
            yield f"{f.who(i)} is inline but streams weights: the loader walks queues only"


# -- queues -------------------------------------------------------------------------------------
def queues_cover(f: Facts) -> Iterator[str]:
    n = len(f.p.tasks)
    count = [0] * n
    for q, queue in enumerate(f.queues):
        for k, i in enumerate(queue):
            if isinstance(i, (int, np.integer)) and 0 <= i < n:
                count[i] += 1
            else:
                yield f"queue {q} position {k}: task id {i!r} outside the {n} tasks"
    for i, c in enumerate(count):
        if f.p.tasks[i].inline and c:
            yield f"{f.who(i)} is inline (its last signaller runs it) but appears in {c} queue entries"
        elif not f.p.tasks[i].inline and c != 1:
            yield f"{f.who(i)} appears in {c} queue entries, not exactly one"


def queues_topological(f: Facts) -> Iterator[str]:
    n = len(f.p.tasks)
    place: dict[int, tuple[int, int]] = {}
    edges = list(f.counter_edges)
    for q, queue in enumerate(f.queues):
        for k, i in enumerate(queue):
            place[int(i)] = (q, k)
        edges += [(int(a), int(b)) for a, b in zip(queue, queue[1:])]
    for cyc in find_cycles(n + len(f.p.counters), edges):
        # NOTE: counter edges alone are acyclic (rule acyclic), so a cycle holds a queue step
        steps = [(a, b) for a, b in zip(cyc, cyc[1:]) if a < n and b < n]
        q, k = place[steps[0][0]]
        yield (f"queue {q} position {k}: {f.who(steps[0][0])} is queued before {f.who(steps[0][1])}, "
               f"which must finish first; cycle: {describe_cycle(f, cyc)}")
