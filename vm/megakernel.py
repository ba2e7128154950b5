"""MegakernelVM: runs a packed program in one cooperative CUDA kernel, one block per SM.

Device tables are uploaded once. run(inputs) checks the runtime inputs on the host, passes the token
id and position in the kernel's arguments, copies any other input that changed into its buffer, and
launches; nothing else. Errors from the device (wait timeout, unknown opcode) surface when a result
is read, as DeviceError with the dump, and the VM resets itself so the next run works.
"""
from __future__ import annotations

import ctypes
from dataclasses import dataclass

import numpy as np
import torch

from megavm.core import abi
from megavm.core.abi import Flag
from megavm.core.errors import BuildError, DeviceError, UserError
from megavm.core.memory import program_bytes, require
from megavm.core.types import BufferKind, DType
from megavm.instructions import op_name
from megavm.vm import build, env
from megavm.vm.inputs import RuntimeInputs
from megavm.vm.loop import LoopError, loop_contract
from megavm.vm.pack import ARENA_KINDS, PackedProgram
from megavm.vm.reference import bind_weights
from megavm.vm.sizing import check_xs, ring_defines


@dataclass(frozen=True)
class Ablations:
    """Runtime research switches; every setting computes bit-identical results. (The schedule's own
    switches, fusions and SM assignment among them, are fields of ScheduleConfig.)"""
    direct_loads: bool = False      # no loader ring: consumers load weights themselves, after the wait
    attn_history: bool = True       # attention's K/V history streams through the loader ring, ahead of its wait
    evict_first: bool = True        # weight copies carry an L2 evict-first hint (activations stay in L2)
    rebuild_tables: bool = False    # re-upload the tables before every launch
    host_loop: bool = False         # generate() launches once per token instead of the in-kernel token loop

    @property
    def flags(self) -> int:
        return int((Flag.DIRECT_LOADS if self.direct_loads else 0) |
                   (0 if self.attn_history else Flag.NO_ATTN_HISTORY) |
                   (0 if self.evict_first else Flag.WEIGHTS_EVICT_NORMAL))


EXPERT_OPS = ("ROUTE", "EXPERT_GLU", "EXPERT_DOWN")     # a BAD_INPUT there is an expert id out of range


class StepResult:
    """Outputs of one launch; reading one waits for the launch and raises its device error, if any."""

    def __init__(self, vm: "MegakernelVM", seq: int):
        self._vm, self._seq = vm, seq
        self._event = torch.cuda.Event()
        self._event.record(vm.stream)

    def wait(self) -> "StepResult":
        self._event.synchronize()
        self._vm._check(self._seq)
        return self

    @property
    def logits(self) -> torch.Tensor:
        return self.wait()._vm.buffer("logits")

    @property
    def token(self) -> int:
        return int(self.wait()._vm.buffer("next_token")[0])

    def outputs(self) -> dict[str, torch.Tensor]:
        self.wait()
        return {n: self._vm.buffer(n).clone() for n in self._vm.output_names}


def program_defines(program: PackedProgram, defines: dict[str, int] | None) -> dict[str, int] | None:
    """The build knobs a program needs beside the caller's: xs and the ring sized to the program
    (MEGAVM_MAX_K, MVM_STAGES; vm/sizing.py), and for a program with an NVFP4 (e2m1) KV cache the
    partial's NVFP4 path for its head_dim (MVM_KV_E2M1 = 64 or 128 builds that head_dim's tensor-core
    instance, 1 CUDA cores only; core/limits.py). A value the caller gives is kept; 0 is refused."""
    check_xs(program.meta.get("xs_floats"), defines)
    ring = ring_defines(program.meta.get("xs_floats"), defines)   # xs sized to the program (vm/sizing.py)
    if ring:
        defines = {**ring, **(defines or {})}
    e2m1 = [r for r in program.buffers if int(r["kind"]) == BufferKind.KV_CACHE and int(r["dtype"]) == DType.E2M1]
    if not e2m1:
        return defines
    if (defines or {}).get("MVM_KV_E2M1", 1) == 0:
        raise UserError("the program holds an NVFP4 (e2m1) KV cache, which the megakernel reads only when built "
                        "with MVM_KV_E2M1 non-zero (defines=)")
    hd = int(e2m1[0]["shape"][2])
    return {"MVM_KV_E2M1": hd if hd in (64, 128) else 1, **(defines or {})}


class MegakernelVM:
    """Runs a packed program (vm.compile.compile) with its weights (by buffer name) on one GPU."""

    def __init__(self, program: PackedProgram, weights: dict, device="cuda", ablations: Ablations = Ablations(),
                 trace: bool = False, defines: dict[str, int] | None = None):
        packed = isinstance(program, PackedProgram)
        inline = np.flatnonzero(program.instrs["flags"] & abi.INSTR_INLINE) if packed else []
        if len(inline) and not (defines or {}).get("MVM_INLINE_TASKS"):      # a program error, GPU or not
            r = program.instrs[int(inline[0])]
            t, labels = int(r["task"]), program.meta.get("labels") or []
            raise UserError(f"task {t} ({labels[t] if t < len(labels) else '?'}, {op_name(int(r['opcode']))}) runs "
                            f"inline: the megakernel runs inline tasks only when built with MVM_INLINE_TASKS=1 "
                            f"(defines=; correct, but measured slower), or lower without inline_combine")
        if not torch.cuda.is_available():
            raise BuildError("MegakernelVM needs a CUDA GPU and torch.cuda.is_available() is False; "
                             "use megavm.vm.reference.ReferenceVM on this machine")
        if not isinstance(program, PackedProgram):
            raise TypeError(f"MegakernelVM takes a PackedProgram (megavm.vm.compile.compile), not "
                            f"{type(program).__name__}")
        self.device = torch.device(device)
        if self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        self.ablations = ablations
        defines = program_defines(program, defines)
        self.defines = defines or {}
        self.lib = build.load(defines=defines)          # build knobs (core/limits.h), e.g. MVM_STAGES
        max_blocks = ctypes.c_int(0)
        rc = self.lib.mvm_prepare(self.device.index, ctypes.byref(max_blocks))
        if rc:
            raise DeviceError(f"preparing the megakernel failed: {self.lib.mvm_error_string(rc).decode()}")
        self.max_blocks = max_blocks.value
        self.p = program
        if program.n_queues > self.max_blocks:
            raise UserError(f"program has {program.n_queues} queues but only {self.max_blocks} blocks of the "
                            f"megakernel fit on this device at once; compile it for at most {self.max_blocks} SMs")
        self.stream = torch.cuda.current_stream(self.device)
        self.inputs = RuntimeInputs(program)
        self._token_input, self._pos_input = self.inputs.token, self.inputs.pos
        self.output_names = [program.names[i] for i, r in enumerate(program.buffers) if r["kind"] == BufferKind.OUTPUT]
        self._alloc(weights, trace)
        self.epoch, self._seq, self._failed_upto = 0, 0, -1
        self._max_producers = int(program.counter_producers.max(initial=1))
        try:
            self.args["step_counter"], self.loop_error = loop_contract(program), None
        except LoopError as e:
            self.args["step_counter"], self.loop_error = -1, e

    # -- memory ----------------------------------------------------------------------------------
    def _alloc(self, weights: dict, trace: bool) -> None:
        p, dev = self.p, self.device
        require("MegakernelVM", {"KV caches": program_bytes(p, [BufferKind.KV_CACHE]),
                                 "activations": int(p.header["arena_bytes"]),
                                 "weights": sum(t.numel() * t.element_size() for t in weights.values()
                                                if isinstance(t, torch.Tensor) and t.device != dev)},
                torch.cuda.mem_get_info(dev)[0], "GPU memory")
        self.t = bind_weights(p, weights, dev)
        self.arena = torch.zeros(int(p.header["arena_bytes"]) + 256, dtype=torch.uint8, device=dev)
        self._words: dict[int, torch.Tensor] = {}      # tagged buffers: value and tag words
        ptrs = np.zeros(len(p.buffers), np.uint64)
        for i, r in enumerate(p.buffers):
            kind, dt, shape = int(r["kind"]), DType(int(r["dtype"])), p.shape(i)
            if kind in ARENA_KINDS:
                off = int(r["arena_offset"])
                self.t[i] = self.arena[off:off + int(r["nbytes"])].view(dt.torch)
                if int(r["flags"]) & abi.BUFFER_TAGGED:
                    # its words: [..., 0] the values (what t holds), [..., 1] the tags (as f32 bits)
                    self._words[i] = self.t[i].view(shape + (2,))
                    self.t[i] = self._words[i][..., 0]
                else:
                    self.t[i] = self.t[i].view(shape)
            elif kind == BufferKind.KV_CACHE:
                self.t[i] = torch.zeros(dt.storage_shape(shape), dtype=dt.torch, device=dev)
            ptrs[i] = self.t[i].data_ptr()
        self._written: dict[str, int] = {}          # scalar inputs in device memory, as last written
        inline_of = p.inline_of() if len(p.counter_producers) else np.full(1, -1, np.int32)
        self._host_tables = {"instrs": p.instrs, "buffers": p.buffers, "queue_offsets": p.queue_offsets,
                             "queue_entries": p.queue_entries, "producers": p.counter_producers, "ptrs": ptrs,
                             "inline_of": inline_of}
        self.tables = {k: torch.from_numpy(np.ascontiguousarray(v).view(np.uint8).copy()).to(dev)
                       for k, v in self._host_tables.items()}
        self.counters = torch.zeros(max(1, len(p.counter_producers)), dtype=torch.int32, device=dev)
        self.error = torch.zeros(abi.ERROR.itemsize // 4, dtype=torch.int32, device=dev)
        self.trace = torch.zeros(4 * len(p.instrs), dtype=torch.int64, device=dev) if trace else None
        a = self.args = np.zeros((), abi.ARGS)       # core/abi.h: mvm_args_t, passed by value at launch
        self._args_ptr = ctypes.c_void_p(a.ctypes.data)
        for k in ("instrs", "buffers", "queue_offsets", "queue_entries", "producers", "ptrs", "inline_of"):
            a[k] = self.tables[k].data_ptr()
        a["counters"], a["error"] = self.counters.data_ptr(), self.error.data_ptr()
        a["trace"] = self.trace.data_ptr() if trace else 0
        a["timeout_ns"] = env.wait_timeout_ms() * 1_000_000
        a["flags"] = self.ablations.flags
        a["n_steps"] = 1

    def buffer(self, name: str) -> torch.Tensor:
        """The device tensor of a buffer (of a tagged one, a view of its values)."""
        return self.t[self.p.buffer_id(name)]

    def _restart_epochs(self) -> None:
        """Counters and tags from step 0 again: tagged words of the old epochs must not pass for new."""
        self.counters.zero_()
        for words in self._words.values():
            words.zero_()
        self.epoch = 0

    # -- running ---------------------------------------------------------------------------------
    def run(self, inputs: dict) -> StepResult:
        """One decode step. Bad inputs raise InputError before anything changes."""
        self._write_inputs(self.inputs.check(inputs))
        return self.relaunch()

    def _write_inputs(self, vals: dict) -> None:
        """The token id and position go to the kernel by value, in its launch arguments; every other
        input is copied into its buffer on the launch stream (a scalar only when it changed)."""
        self.args["token"] = vals.get(self._token_input, 0)
        self.args["pos"] = vals.get(self._pos_input, 0)
        for name, v in vals.items():
            if name in (self._token_input, self._pos_input) or (isinstance(v, int) and self._written.get(name) == v):
                continue
            host = torch.tensor([v], dtype=torch.int32) if isinstance(v, int) else v
            with torch.cuda.stream(self.stream):      # from pinned memory, ordered before the launch
                self.t[self.inputs.buffer_id(name)].copy_(host.pin_memory(), non_blocking=True)
            if isinstance(v, int):
                self._written[name] = v

    def relaunch(self) -> StepResult:
        """Launch again on the last run's inputs (kernel-only timing)."""
        return self._launch(1)

    def _launch(self, steps: int) -> StepResult:
        if (self.epoch + steps + 1) * self._max_producers >= 1 << 31:
            self._restart_epochs()
        if self.ablations.rebuild_tables:
            for k, v in self._host_tables.items():
                self.tables[k].copy_(torch.from_numpy(np.ascontiguousarray(v).view(np.uint8)))
        self.args["epoch"] = self.epoch
        rc = self.lib.mvm_launch(self._args_ptr, self.p.n_queues, ctypes.c_void_p(self.stream.cuda_stream))
        if rc:
            raise DeviceError(f"launching the megakernel failed: {self.lib.mvm_error_string(rc).decode()}")
        self.epoch += steps
        self._seq += 1
        return StepResult(self, self._seq)

    def generate(self, prompt_ids: list[int], n: int, start_pos: int = 0, inputs: dict | None = None) -> list[int]:
        """Greedy decoding: feed the prompt from start_pos, then n new tokens; returns the new tokens.
        inputs: the program's other runtime inputs, held for every step (e.g. {"adapter": 2}).

        One launch runs every step (the in-kernel token loop, vm/loop.py): the device embeds each
        argmax token and starts the next step. Ablations(host_loop=True) launches once per token.
        Every token id and position is checked before anything runs."""
        prompt, steps, others = self.inputs.check_generation(prompt_ids, n, start_pos, inputs)
        tok, pos = self._token_input, self._pos_input
        if self.ablations.host_loop:
            return self._generate_host(prompt, n, start_pos, others)
        if self.loop_error is not None:
            raise self.loop_error
        seq = torch.tensor(prompt + [0] * n, dtype=torch.int32).pin_memory().to(self.device, non_blocking=True)
        self._write_inputs({tok: prompt[0], pos: start_pos, **others})
        a = self.args
        a["seq"], a["n_steps"], a["n_prompt"] = seq.data_ptr(), steps, len(prompt)
        try:
            res = self._launch(steps)
        finally:
            a["seq"], a["n_steps"], a["n_prompt"] = 0, 1, 0
        res.wait()
        return seq[len(prompt):].tolist()

    def _generate_host(self, prompt: list[int], n: int, start_pos: int, others: dict) -> list[int]:
        out, tok, pos = [], prompt[0], start_pos
        for i in range(len(prompt) + n - 1):
            nxt = self.run({self._token_input: tok, self._pos_input: pos, **others}).token
            pos += 1
            if i + 1 < len(prompt):
                tok = prompt[i + 1]
            else:
                out.append(nxt)
                tok = nxt
        return out

    # -- errors ----------------------------------------------------------------------------------
    def _check(self, seq: int) -> None:
        if seq <= self._failed_upto:
            raise DeviceError(f"launch {seq} ran after a failed launch and did nothing; see the earlier error")
        err = self.error.cpu().numpy().view(abi.ERROR)[0]
        if int(err["status"]) == abi.Status.OK:
            return
        dump = {k: int(err[k]) for k in abi.ERROR.names}
        self._failed_upto = self._seq
        self.error.zero_()
        self._restart_epochs()
        torch.cuda.synchronize(self.device)
        raise DeviceError(self._describe(dump), dump)

    def _describe(self, d: dict) -> str:
        labels = self.p.meta.get("labels", [])
        counters = self.p.meta.get("counters", [])
        label = labels[d["task"]] if d["task"] < len(labels) else "?"
        head = (f"block {d['block']}, queue position {d['instr']}, task {d['task']} ({label}, "
                f"{op_name(d['opcode'])})")
        s = d["status"]
        if s == abi.Status.WAIT_TIMEOUT:
            cname = counters[d["counter"]] if 0 <= d["counter"] < len(counters) else "?"
            return (f"megakernel wait timed out after {env.wait_timeout_ms()} ms: {head} waited on counter "
                    f"{d['counter']} ({cname}) = {d['value']}, needs {d['target']}")
        if s == abi.Status.BAD_OPCODE:
            return f"megakernel met unknown opcode {d['value']} at {head}"
        if s == abi.Status.TAG_TIMEOUT:
            b = d["counter"]
            bname = self.p.names[b] if 0 <= b < len(self.p.names) else "?"
            return (f"megakernel poll timed out after {env.wait_timeout_ms()} ms: {head} polled tagged buffer "
                    f"{bname!r} (#{b}) and saw tag {d['value']}, needs {d['target']} (its writer never stored it)")
        if s == abi.Status.BAD_INPUT and op_name(d["opcode"]) in EXPERT_OPS:
            return f"megakernel met expert id {d['value']} outside the {d['target']} experts at {head}"
        if s == abi.Status.BAD_INPUT:
            return f"megakernel refused runtime input {d['value']} (limit {d['target']}) at {head}"
        return f"megakernel aborted with status {s} at {head}"

    def timeline(self) -> np.ndarray | None:
        """[n_tasks, 4] of the last launch (trace=True only): start, waits satisfied, end (ns), block."""
        if self.trace is None:
            return None
        torch.cuda.synchronize(self.device)
        return self.trace.view(-1, 4).cpu().numpy()
