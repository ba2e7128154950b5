"""ReferenceVM: the specification. It runs the packed tables (not the Python program) with each
opcode's torch reference, simulating the per-SM queues and monotonic counters.

Queue heads run when their waits hold; by default the lowest ready queue goes first, with a seed a
random ready queue does. check=True flags, as it runs, any access out of program order (a read before
all its writers finished, a write while an older value still has readers) and poisons activations
with NaN before each step so unwritten reads show.
"""
from __future__ import annotations

import heapq
import random

import torch

from megavm.core.errors import DeadlockError, RaceError, UserError
from megavm.core.memory import host_bytes_available, program_bytes, require
from megavm.core.types import BufferKind, DType
from megavm.instructions import SPECS, spec
from megavm.schedule.quant import e4m3_nan
from megavm.schedule.weights import e2m1_weight, fp8_block_weight, mx_weight, u4_table_problem, u4_weight
from megavm.vm.inputs import RuntimeInputs
from megavm.vm.pack import PackedProgram

SHARED = (BufferKind.ACTIVATION, BufferKind.OUTPUT, BufferKind.KV_CACHE)


def bind_weights(packed: PackedProgram, weights: dict, device) -> dict[int, torch.Tensor]:
    """Weight buffers by name, checking shape and dtype and naming the offending buffer."""
    out = {}
    for i, r in enumerate(packed.buffers):
        if r["kind"] != BufferKind.WEIGHT:
            continue
        name, shape, dt = packed.names[i], packed.shape(i), DType(int(r["dtype"]))
        if name not in weights:
            raise UserError(f"weights lack buffer {name!r} (shape {shape}, {dt.name.lower()})")
        w = weights[name]
        if tuple(w.shape) != dt.storage_shape(shape):
            raise UserError(f"weight {name!r} has shape {tuple(w.shape)}, the program expects "
                            f"{dt.storage_shape(shape)}" + (f" (bytes of {shape} {dt.name.lower()} codes)"
                                                             if dt.nibbles else ""))
        if w.dtype != dt.torch:
            raise UserError(f"weight {name!r} has dtype {w.dtype}, the program expects {dt.torch}")
        out[i] = w.to(device).contiguous()
    for i, r in enumerate(packed.buffers):  # e4m3 weights: no NaN code, their row scales finite
        if r["dtype"] == DType.F8E4M3 and i in out and (nan := e4m3_nan(out[i])) is not None:
            raise UserError(f"weight {packed.names[i]!r} holds a NaN code (e4m3 0x7f or 0xff) at {nan}")
        s = int(r["scale"])
        if r["dtype"] in (DType.F8E4M3, DType.E2M1) and s in out and not bool(torch.isfinite(out[s]).all()):
            bad = (~torch.isfinite(out[s])).nonzero()[0].tolist()
            raise UserError(f"weight {packed.names[s]!r} (the row scales of {packed.names[i]!r}) holds "
                            f"{out[s][tuple(bad)].item()} at {bad}")
        g = int(r["block_scale"])
        if r["dtype"] == DType.F8E4M3 and g in out and not bool((torch.isfinite(out[g]) & (out[g] >= 0)).all()):
            bad = (~(torch.isfinite(out[g]) & (out[g] >= 0))).nonzero()[0].tolist()
            raise UserError(f"weight {packed.names[g]!r} (the 128 x 128 block scales of {packed.names[i]!r}) holds "
                            f"{out[g][tuple(bad)].item()} at {bad}")
        if g in out and DType(int(packed.buffers[g]["dtype"])) == DType.E8M0 and bool((out[g] == 255).any()):
            raise UserError(f"weight {packed.names[g]!r} (the e8m0 block exponents of {packed.names[i]!r}) holds "
                            f"the NaN exponent 255 at {(out[g] == 255).nonzero()[0].tolist()}")
        if r["dtype"] == DType.U4 and g in out and (bad := u4_table_problem(out[g])):
            raise UserError(f"weight {packed.names[g]!r} (the group table of {packed.names[i]!r}) {bad}")
    for r in packed.instrs:               # weights whose values an opcode constrains (a router's hash table)
        s = SPECS.get(int(r["opcode"]))  # an unknown opcode is the kernel's to trap on, naming it
        if s is None or s.weight_values is None:
            continue
        ins = [int(b) for b in r["inputs"][:r["n_inputs"]]]
        bufs = [packed.buffer(b) if b >= 0 else None for b in ins]
        problems = s.weight_values(s.decode_params(r["params"]), bufs, [out.get(b) for b in ins])
        if problems:
            raise UserError(f"{s.name} task {int(r['task'])}: {problems[0]}")
    return out


class ReferenceVM:
    def __init__(self, packed: PackedProgram, weights: dict, device="cpu", check: bool = False,
                 seed: int | None = None):
        self.p, self.device, self.check, self.seed = packed, torch.device(device), check, seed
        self.rng = random.Random(seed)
        free = torch.cuda.mem_get_info(self.device)[0] if self.device.type == "cuda" else host_bytes_available()
        require("ReferenceVM", {"KV caches": program_bytes(packed, [BufferKind.KV_CACHE]),
                                "activations": program_bytes(packed, [BufferKind.ACTIVATION, BufferKind.OUTPUT])},
                free, f"{self.device.type} memory")
        self.t = bind_weights(packed, weights, self.device)
        for i, r in enumerate(packed.buffers):      # packed weights run as what they stand for: e2m1 code x block x row
            if r["kind"] != BufferKind.WEIGHT:
                continue
            if r["dtype"] == DType.E2M1 and int(r["scale"]) < 0:          # mxfp4: code x 2^(e - 127)
                self.t[i] = mx_weight(self.t[i], self.t[int(r["block_scale"])])
            elif r["dtype"] == DType.E2M1:
                self.t[i] = e2m1_weight(self.t[i], self.t[int(r["block_scale"])], self.t[int(r["scale"])])
            if r["dtype"] == DType.U4:                # int4: (code - zero) x scale of each group of 128
                self.t[i] = u4_weight(self.t[i], self.t[int(r["block_scale"])])
        for i, r in enumerate(packed.buffers):      # e4m3 weights run as what they stand for: code x row scale
            if r["dtype"] == DType.F8E4M3 and int(r["scale"]) >= 0:
                self.t[i] = self.t[i].float() * self.t[int(r["scale"])].unsqueeze(-1)
            elif r["dtype"] == DType.F8E4M3 and int(r["block_scale"]) >= 0 and r["kind"] == BufferKind.WEIGHT:
                self.t[i] = fp8_block_weight(self.t[i], self.t[int(r["block_scale"])])
        for i, r in enumerate(packed.buffers):
            if r["kind"] != BufferKind.WEIGHT:
                dt = DType(int(r["dtype"]))
                self.t[i] = torch.zeros(dt.storage_shape(packed.shape(i)), dtype=dt.torch, device=self.device)
        self.inputs = RuntimeInputs(packed)
        self.specs = [spec(int(r["opcode"])) for r in packed.instrs]
        self.params = [s.decode_params(r["params"]) for s, r in zip(self.specs, packed.instrs)]
        # each instruction's waits as (counter, threshold) and its signal, and each counter's inline
        # waiter (-1: none), read from the tables once
        w = packed.instrs["waits"]
        self._waits = [list(zip(c[:n], t[:n])) for c, t, n in zip(w["counter"].tolist(), w["threshold"].tolist(),
                                                                  packed.instrs["n_waits"].tolist())]
        self._signals = packed.instrs["signal"].tolist()
        self._inline_of = packed.inline_of().tolist()
        self.steps = 0
        self.trace: list[int] = []          # instruction indices in the order the last step ran them
        if check:
            self._conflicts = self._find_conflicts()

    # -- one decode step -------------------------------------------------------------------------
    def step(self, inputs: dict) -> dict[str, torch.Tensor]:
        vals = self.inputs.check(inputs)
        for name, v in vals.items():
            t = self.t[self.inputs.buffer_id(name)]
            t.fill_(v) if isinstance(v, int) else t.copy_(v)
        if self.check:
            for i, r in enumerate(self.p.buffers):
                if r["kind"] in (BufferKind.ACTIVATION, BufferKind.OUTPUT) and self.t[i].is_floating_point():
                    self.t[i].fill_(float("nan"))
        self._run()
        self.steps += 1
        return {self.p.names[i]: self.t[i].clone() for i, r in enumerate(self.p.buffers)
                if r["kind"] == BufferKind.OUTPUT}

    def buffer(self, name: str) -> torch.Tensor:
        return self.t[self.p.buffer_id(name)]

    def _run(self) -> None:
        p = self.p
        nq = p.n_queues
        queues = [p.queue(q).tolist() for q in range(nq)]
        head = [0] * nq
        counters = [0] * len(p.counter_producers)
        done = bytearray(len(p.instrs))
        waits, signals, inline_of = self._waits, self._signals, self._inline_of
        blocked: dict[int, list[tuple[int, int]]] = {}   # counter -> (threshold, queue), in blocking order
        lowest: dict[int, int] = {}                       # counter -> the lowest threshold blocked on it
        ready: list[int] = []
        self.trace = []

        def enqueue(q: int) -> None:
            if head[q] >= len(queues[q]):
                return
            for c, threshold in waits[queues[q][head[q]]]:
                if counters[c] < threshold:
                    blocked.setdefault(c, []).append((threshold, q))
                    lowest[c] = min(lowest.get(c, threshold), threshold)
                    return
            ready.append(q) if self.seed is not None else heapq.heappush(ready, q)

        def run(i: int) -> None:
            """Run instruction i, signal, then run what its signal completes inline, on this queue."""
            if self.check:
                self._check_order(i, done)
            self._execute(i)
            done[i] = 1
            self.trace.append(i)
            c = signals[i]
            if c < 0:
                return
            counters[c] += 1
            # the queues this signal frees, in the order they blocked; the rest block again, in order
            if c in blocked and lowest[c] <= counters[c]:
                del lowest[c]
                for threshold, bq in blocked.pop(c):
                    if threshold <= counters[c]:
                        enqueue(bq)
                    else:
                        blocked.setdefault(c, []).append((threshold, bq))
                        lowest[c] = min(lowest.get(c, threshold), threshold)
            k = inline_of[c]
            if k >= 0 and waits[k][0][1] == counters[c]:       # the signal that completes its one wait
                run(k)

        for q in range(nq):
            enqueue(q)
        remaining = len(p.queue_entries)
        while ready:
            if self.seed is None:
                q = heapq.heappop(ready)
            else:
                q = ready.pop(self.rng.randrange(len(ready)))
            i = int(queues[q][head[q]])
            head[q] += 1
            remaining -= 1
            run(i)
            enqueue(q)
        stranded = [k for k in inline_of if k >= 0 and not done[k]]
        if remaining or stranded:
            raise DeadlockError(self._deadlock_report(queues, head, counters, stranded))

    def _execute(self, i: int) -> None:
        r = self.p.instrs[i]
        ins = [self.t[b] if b >= 0 else None for b in r["inputs"][:r["n_inputs"]]]
        outs = [self.t[b] if b >= 0 else None for b in r["outputs"][:r["n_outputs"]]]
        self.specs[i].reference(self.params[i], ins, outs)

    def _deadlock_report(self, queues, head, counters, stranded=()) -> str:
        lines = [f"deadlock: {sum(len(q) - h for q, h in zip(queues, head)) + len(stranded)} instructions cannot run"]
        for i in stranded[:5]:
            w = self.p.instrs[i]["waits"][0]
            lines.append(f"  inline task {int(self.p.instrs[i]['task'])} ({self.specs[i].name}) waits on counter "
                         f"{int(w['counter'])} = {counters[w['counter']]}, never exactly {int(w['threshold'])}")
        for q, h in enumerate(head):
            if h >= len(queues[q]):
                continue
            i = int(queues[q][h])
            r = self.p.instrs[i]
            names = self.p.meta.get("counters") or []
            waits = ", ".join(f"counter {int(w['counter'])}"
                              f"{' (' + names[w['counter']] + ')' if w['counter'] < len(names) else ''}"
                              f" = {counters[w['counter']]} < {int(w['threshold'])}"
                              for w in r["waits"][:r["n_waits"]] if counters[w["counter"]] < w["threshold"])
            lines.append(f"  queue {q} head {h}: task {int(r['task'])} ({self.specs[i].name}) waits on {waits}")
            if len(lines) > 20:
                lines.append("  ...")
                break
        return "\n".join(lines)

    # -- checking mode ---------------------------------------------------------------------------
    def _accesses(self, i: int):
        r = self.p.instrs[i]
        ins, outs = r["inputs"][:r["n_inputs"]], r["outputs"][:r["n_outputs"]]
        acc = self.specs[i].accesses(self.params[i], *self.p.operands(i))
        for a in acc:
            b = int((ins if a.io == "in" else outs)[a.slot])
            if self.p.buffers[b]["kind"] in SHARED:
                yield b, a.box, a.io == "out"

    def _find_conflicts(self) -> list[list[tuple[int, int, bool]]]:
        """For each instruction: (other instruction, buffer, other is earlier in program order)."""
        by_buf: dict[int, list] = {}
        for i in range(len(self.p.instrs)):
            for b, box, w in self._accesses(i):
                by_buf.setdefault(b, []).append((i, box, w))
        out: list[list] = [[] for _ in self.p.instrs]
        for b, accs in by_buf.items():
            for x in range(len(accs)):
                i, bi, wi = accs[x]
                for y in range(x + 1, len(accs)):
                    j, bj, wj = accs[y]
                    if i != j and (wi or wj) and all(lo1 < hi2 and lo2 < hi1 for (lo1, hi1), (lo2, hi2) in zip(bi, bj)):
                        ti, tj = int(self.p.instrs[i]["task"]), int(self.p.instrs[j]["task"])
                        out[i].append((j, b, tj < ti))
                        out[j].append((i, b, ti < tj))
        return out

    def _check_order(self, i: int, done: bytearray) -> None:
        for j, b, earlier in self._conflicts[i]:
            if earlier != bool(done[j]):
                ti, tj = int(self.p.instrs[i]["task"]), int(self.p.instrs[j]["task"])
                what = "has not finished" if earlier else "already ran"
                raise RaceError(f"task {ti} ({self.specs[i].name}) runs while task {tj} ({self.specs[j].name}), "
                                f"which program order puts {'before' if earlier else 'after'} it on buffer "
                                f"{self.p.names[b]!r}, {what}")
