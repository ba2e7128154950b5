"""SM assignment: per-SM instruction queues, each consistent with the program's one global
topological order (tasks are appended in program order). Strategies are chosen by name."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from megavm.schedule.ir import Program


@dataclass(frozen=True)
class CostModel:
    """Estimated time of a task on one SM, in nanoseconds."""
    bytes_per_ns: float = 22.0       # one SM's share of HBM bandwidth
    flops_per_ns: float = 4000.0
    overhead_ns: float = 600.0       # wait, dispatch, signal

    def task_ns(self, est_bytes: int, est_flops: int) -> float:
        return max(est_bytes / self.bytes_per_ns, est_flops / self.flops_per_ns) + self.overhead_ns


def round_robin(program: Program, n_sms: int, cost: CostModel = CostModel()) -> list[list[int]]:
    queues: list[list[int]] = [[] for _ in range(n_sms)]
    for i in range(len(program.tasks)):
        queues[i % n_sms].append(i)
    return queues


def balanced(program: Program, n_sms: int, cost: CostModel = CostModel()) -> list[list[int]]:
    """Earliest-finish list scheduling in program order: each task goes to the SM where, given
    when its counters are expected to be satisfied, it would finish first (ties: least loaded).
    Counter ids outside the program are passed over (the validator names them)."""
    queues: list[list[int]] = [[] for _ in range(n_sms)]
    free = np.zeros(n_sms)
    nc = len(program.counters)
    counter_done = np.zeros(nc)
    for i, t in enumerate(program.tasks):
        ready = max((counter_done[w.counter] for w in t.waits if 0 <= w.counter < nc), default=0.0)
        start = np.maximum(free, ready)
        sm = int(np.argmin(start))
        finish = start[sm] + cost.task_ns(t.est_bytes, t.est_flops)
        free[sm] = finish
        queues[sm].append(i)
        if 0 <= t.signal < nc:
            counter_done[t.signal] = max(counter_done[t.signal], finish)
    return queues


STRATEGIES: dict[str, Callable[..., list[list[int]]]] = {"balanced": balanced, "round_robin": round_robin}


def assign(program: Program, n_sms: int, strategy: str = "balanced", cost: CostModel = CostModel()) -> list[list[int]]:
    if n_sms < 1:
        raise ValueError(f"n_sms={n_sms} must be >= 1")
    try:
        fn = STRATEGIES[strategy]
    except KeyError:
        raise ValueError(f"unknown assignment strategy {strategy!r}; choose from {sorted(STRATEGIES)}") from None
    return fn(program, n_sms, cost)


def predicted_ns(program: Program, queues: list[list[int]], cost: CostModel = CostModel()) -> float:
    """Makespan of the queues under the cost model (queues run in order, waits respected)."""
    pos = [0] * len(queues)
    free = [0.0] * len(queues)
    done = [0.0] * len(program.counters)
    left = [0] * len(program.counters)
    for t in program.tasks:
        if t.signal >= 0:
            left[t.signal] += 1
    progress = True
    while progress:
        progress = False
        for q, queue in enumerate(queues):
            while pos[q] < len(queue):
                t = program.tasks[queue[pos[q]]]
                if any(left[w.counter] > 0 for w in t.waits):
                    break
                start = max([free[q]] + [done[w.counter] for w in t.waits])
                free[q] = start + cost.task_ns(t.est_bytes, t.est_flops)
                if t.signal >= 0:
                    left[t.signal] -= 1
                    done[t.signal] = max(done[t.signal], free[q])
                pos[q] += 1
                progress = True
    return max(free)
