"""The in-kernel token loop: many decode steps in one launch, with no host work between them.

Step s of a launch decodes seq[s] at position pos + s, and the task with a NEXT_TOKEN output (ARGMAX)
writes seq[s + 1] (after the prompt). Steps are chained on the device: the root tasks of step s (those
with no waits: the embedding tiles) wait until the step counter shows step s - 1 finished. That is enough to make
step s + 1's writes of every activation buffer come after step s's reads of it when the program has
ONE step end: a task that every other task reaches through full waits (threshold = all producers
of the counter), so its signal means the whole step is done. loop_contract() checks that and
returns the step counter; programs that break it are refused, not run with a race.
"""
from __future__ import annotations

import networkx as nx

from megavm.core.errors import UserError
from megavm.instructions import feeds_next_token
from megavm.vm.pack import PackedProgram, task_graph


class LoopError(UserError):
    """The program cannot be run by the in-kernel token loop."""


def loop_contract(p: PackedProgram) -> int:
    """The counter the in-kernel loop chains steps on; LoopError names what is missing."""
    ins = p.instrs
    labels = p.meta.get("labels") or [f"task {i}" for i in range(len(ins))]
    feeds = [i for i in range(len(ins)) if feeds_next_token(int(ins[i]["opcode"]))]
    if len(feeds) != 1:
        raise LoopError(f"the token loop needs exactly one task that writes the next token (ARGMAX); "
                        f"the program has {len(feeds)}")
    end = feeds[0]
    if int(ins[end]["signal"]) < 0:
        raise LoopError(f"the step end {labels[end]} signals no counter")
    # producer -> counter -> task waiting for all of its producers (a partial wait proves nothing about
    # every producer, so it adds no edge)
    g = task_graph(ins, p.counter_producers)
    seen = nx.ancestors(g, end) | {end}
    missing = [t for t in range(len(ins)) if t not in seen]
    if missing:
        names = ", ".join(labels[i] for i in missing[:5])
        raise LoopError(f"{len(missing)} tasks finish outside the step end {labels[end]} (through full waits), "
                        f"so the next step could overwrite what they read: {names}")
    return int(ins[end]["signal"])
