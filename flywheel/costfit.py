"""The balanced assignment's cost model, fitted on a traced run instead of written by hand.

From one launch's timeline (MegakernelVM(trace=True): per task its start, the moment its waits were
satisfied, and its end) and the program's tasks (their estimated bytes), per opcode a least-squares
line run_ns = overhead + bytes / bytes_per_ns; and the hand-off: for tasks that were already waiting
when their last counter completed, the median time from that completion (its last producer's end) to
the waiter's start of work. The result is a ScheduleConfig.cost table, which `megavm tune` tries as
one more knob (the assignment it gives is measured like any other configuration).
"""
from __future__ import annotations

import numpy as np

from megavm.instructions import Op
from megavm.schedule.assign import CostModel
from megavm.schedule.ir import Program

MIN_TASKS = 4


def fit(program: Program, timeline: np.ndarray) -> tuple:
    """((opcode name, overhead ns, bytes per ns), ..., ("handoff", ns, 0.0)) from a traced launch; the
    timeline's rows are the program's tasks in order."""
    tl = np.asarray(timeline, dtype=np.int64)
    if tl.shape != (len(program.tasks), 4):
        raise ValueError(f"timeline has shape {tl.shape}, expected ({len(program.tasks)}, 4)")
    default = CostModel()
    run = (tl[:, 2] - tl[:, 1]).astype(np.float64)
    nbytes = np.array([t.est_bytes for t in program.tasks], dtype=np.float64)
    ops = np.array([t.opcode for t in program.tasks])
    rows = []
    for op in sorted(set(ops.tolist())):
        sel = ops == op
        x, y = nbytes[sel], run[sel]
        if sel.sum() < MIN_TASKS:
            continue
        slope = np.polyfit(x, y, 1)[0] if x.std() > 0 else 0.0
        if slope > 1e-6:
            bpn = 1.0 / slope
            overhead = float(np.median(y - x * slope))
        else:                           # no byte dependence seen: a fixed cost, bytes at the default rate
            bpn = default.bytes_per_ns
            overhead = float(np.median(y - x / bpn))
        rows.append((Op(op).name, max(0.0, overhead), float(bpn)))
    end_of = {}                         # counter -> its last producer's end
    for i, t in enumerate(program.tasks):
        if t.signal >= 0:
            end_of[t.signal] = max(end_of.get(t.signal, 0), int(tl[i, 2]))
    gaps = []
    for i, t in enumerate(program.tasks):
        if t.waits:
            ready = max(end_of.get(w.counter, 0) for w in t.waits)
            if tl[i, 0] < ready <= tl[i, 1]:          # waiting when it became ready
                gaps.append(tl[i, 1] - ready)
    rows.append(("handoff", float(np.median(gaps)) if gaps else 0.0, 0.0))
    return tuple(rows)
