"""The validator: refuses a program (and optionally its per-SM queues) that could deadlock or race.

Rules run in table order. A rule that needs a well-formed program is skipped, with a note, when a
rule it needs found problems; nothing is ever skipped for size.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from megavm.core.errors import MegavmError
from megavm.schedule import queue_rules as Q
from megavm.schedule import rules as R
from megavm.schedule import tagging as T
from megavm.schedule import weight_rules as W
from megavm.schedule.ir import Program

RULES = [
    ("ids_in_range", R.ids_in_range),            # buffer, counter and opcode ids exist
    ("abi_limits", R.abi_limits),                # waits per task, buffer ranks fit the packed tables
    ("arity", R.arity),                          # operand count, kind and dtype per slot
    ("weight_scales", W.weight_scales),          # every packed weight has its scale tables (weight_rules.py)
    ("params", R.params),                        # params as the spec names them; shapes and capacities
    ("wait_satisfiable", R.wait_satisfiable),    # 1 <= threshold <= producers; no self-wait
    ("all_join", R.all_join),                    # a shared counter is waited for by all its producers
    ("acyclic", R.acyclic),                      # counter edges form no cycle
    ("program_order", R.program_order),          # Program.tasks is a topological order
    ("late_bound", R.late_bound),                # a late-bound stream's ids are covered by one full-join wait
    ("history", R.history),                      # a history stream's KV rows are covered by one full-join wait
    ("inline", Q.inline),                        # an inline task: one wait, no weight streams, one per counter
    ("tagged", T.tagged),                        # tagged buffers and polled waits (schedule/tagging.py)
    ("read_only", R.read_only),                  # WEIGHT and INPUT buffers are never written
    ("read_after_write", R.read_after_write),    # activations are written, before they are read
    ("no_race", R.no_race),                      # conflicting accesses are ordered by counters
    ("outputs_written", R.outputs_written),      # every OUTPUT buffer is fully written
    ("queues_cover", Q.queues_cover),            # every task in exactly one queue (an inline task in none)
    ("queues_topological", Q.queues_topological),  # queues agree with one global topological order
]
QUEUE_RULES = {"queues_cover", "queues_topological"}
_MEMORY = ("ids_in_range", "abi_limits", "arity", "params", "program_order")
NEEDS: dict[str, tuple[str, ...]] = {
    "abi_limits": ("ids_in_range",),
    "arity": ("ids_in_range",),
    "weight_scales": ("ids_in_range",),
    "params": ("ids_in_range", "arity"),
    "wait_satisfiable": ("ids_in_range",),
    "all_join": ("ids_in_range",),
    "acyclic": ("ids_in_range",),
    "program_order": ("ids_in_range",),
    "late_bound": ("ids_in_range", "arity", "params"),
    "history": ("ids_in_range", "arity", "params"),
    "inline": ("ids_in_range", "arity", "params"),
    "tagged": _MEMORY,
    "read_only": ("ids_in_range",),
    "read_after_write": _MEMORY,
    "no_race": _MEMORY,
    "outputs_written": _MEMORY,
    "queues_topological": ("ids_in_range", "acyclic", "queues_cover"),
}
SHOWN = 20


@dataclass
class Problem:
    rule: str
    message: str

    def __str__(self) -> str:
        return f"[{self.rule}] {self.message}"


@dataclass
class Report:
    problems: list[Problem]
    seconds: float
    rules_run: list[str]
    notes: list[str] = field(default_factory=list)          # rules skipped, and why
    timings: dict[str, float] = field(default_factory=dict)  # seconds per rule run

    @property
    def ok(self) -> bool:
        return not self.problems

    def __str__(self) -> str:
        head = (f"program valid: {len(self.rules_run)} rules passed" if self.ok else
                f"program invalid: {len(self.problems)} problems") + f" in {self.seconds:.2f}s"
        lines = [head] + [f"  {p}" for p in self.problems[:SHOWN]]
        if len(self.problems) > SHOWN:
            lines.append(f"  ... and {len(self.problems) - SHOWN} more")
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)


class ValidationError(MegavmError):
    """The validator refused a program; the report names every problem."""

    def __init__(self, report: Report):
        super().__init__(str(report))
        self.report = report


def validate(program: Program, queues: list[list[int]] | None = None) -> Report:
    start = time.perf_counter()
    facts = R.Facts(program, queues)
    problems: list[Problem] = []
    run: list[str] = []
    notes: list[str] = []
    timings: dict[str, float] = {}
    failed: set[str] = set()
    for name, fn in RULES:
        if name in QUEUE_RULES and queues is None:
            continue
        blocked = [n for n in NEEDS.get(name, ()) if n in failed]
        if blocked:
            notes.append(f"skipped {name}: it needs {', '.join(blocked)} to pass")
            failed.add(name)
            continue
        t0 = time.perf_counter()
        try:
            found = [Problem(name, m) for m in fn(facts)]
        except Exception as e:   # a malformed program the rule could not digest is refused, not passed
            found = [Problem(name, f"rule raised {type(e).__name__}: {e}")]
        timings[name] = time.perf_counter() - t0
        run.append(name)
        if found:
            failed.add(name)
            problems += found
    return Report(problems, time.perf_counter() - start, run, notes, timings)


def check(program: Program, queues: list[list[int]] | None = None) -> Report:
    report = validate(program, queues)
    if not report.ok:
        raise ValidationError(report)
    return report
