"""The megavm command line. Each subcommand is one entry in COMMANDS: name -> (add its arguments, run it).

  megavm run       decode through the VM, greedy or sampled; every step checked against the eager model
                   (megavm/run_cli.py)
  megavm validate  lower, assign and validate a program; print the verdict
  megavm fuzz      run the validator's fuzzer; fail if it accepted an unsafe program
  megavm info      the model presets
  megavm bench     time megavm against eager, CUDA graph and torch.compile on a GPU (flywheel/bench.py)
  megavm trace     per-instruction timeline as Chrome-trace JSON and a PNG (flywheel/trace.py)
  megavm tune      search the schedule's knobs on a GPU; record every configuration in the corpus
                   (megavm/tune_cli.py, flywheel/); run and bench use the best one found
  megavm quantize  write a checkpoint's projections and LM head in fp8, nvfp4, mxfp4 or int4 (schedule/quant.py)

Exit status: 0 PASS, 1 FAIL (a result outside tolerance, an invalid program, a failed run), 2 a user
error (one line on stderr naming the argument, file or value), 3 a bug in megavm (with its traceback).
"""
from __future__ import annotations

import argparse
import sys
import traceback
from typing import Callable

import torch

from megavm import dlrm_cli
from megavm.quantize_cli import cmd_quantize, setup_quantize
from megavm.tune_cli import cmd_tune, setup_tune
from megavm.run_cli import cmd_run, default_sms, describe, model_config, resolve_device, setup_run
from megavm.args import Parser, add_model_args, add_program_args, count
from megavm.core.errors import MegavmError, RunError, UserError
from megavm.core.memory import host_bytes_available, require
from megavm.dlrm_cli import is_dlrm
from megavm.flywheel.bench import cmd_bench, setup_bench
from megavm.flywheel.trace import cmd_trace, setup_trace
from megavm.schedule.config import ScheduleConfig
from megavm.schedule.dlrm import PRESETS as DLRM_PRESETS
from megavm.schedule.footprint import footprint, require_attention_split
from megavm.schedule.models import PRESETS
from megavm.schedule.validate import ValidationError
from megavm.schedule.weights import hf_shapes


def setup_validate(p: argparse.ArgumentParser) -> None:
    add_model_args(p)
    add_program_args(p, "512")
    p.add_argument("--program", metavar="FILE", help="validate a saved program (IR JSON, docs/ir.md) instead")
    p.add_argument("--save", metavar="FILE", help="also save the program as IR JSON")


def cmd_validate(a: argparse.Namespace) -> int:
    """Lower, assign and validate one decode step, or a saved program; print the verdict (exit 1 if invalid)."""
    from megavm.schedule.assign import assign, crowded_partials
    from megavm.schedule.checkpoint import inspect
    from megavm.schedule.ir import Program
    from megavm.schedule.plan import Plan, plan
    from megavm.schedule.validate import validate

    n_sms = a.sms or default_sms(resolve_device("auto"))
    if a.program:
        program = Program.load(a.program)
        b = Plan(program, queues := assign(program, n_sms, a.strategy), validate(program, queues))
        print(f"{a.program}: a saved program")
    elif is_dlrm(a):
        dlrm_cli.refuse_decoder_args(a)
        cfg, sc = dlrm_cli.schedule(a, n_sms)
        b = plan(cfg, sc)
        print(dlrm_cli.describe(a.model, cfg, sc))
    else:
        cfg, dt, name = model_config(a)
        sc = ScheduleConfig(dtype=dt, capacity=a.capacity or 512, n_sms=n_sms, strategy=a.strategy)
        require_attention_split(cfg, sc)
        require("validating this program", {"compiling the program": footprint(cfg, sc).compile_bytes},
                host_bytes_available(), "host memory")
        if a.checkpoint:
            header = inspect(a.checkpoint, cfg)
            print(f"{a.checkpoint}: {len(header.files)} tensors in {len(set(header.files.values()))} file(s) fit "
                  f"config.json (headers; data not read)")
        b = plan(cfg, sc)
        print(describe(name, cfg, dt))
    print(f"{len(b.program.tasks)} tasks, {len(b.program.counters)} counters, {len(b.program.buffers)} buffers, "
          f"{n_sms} queues ({a.strategy})")
    crowded, layers = crowded_partials(b.program, b.queues)
    if crowded:
        print(f"placement: {crowded} attention partials queue right behind a q/k/v-stage task of their own layer, "
              f"in {layers} layers (they start when it ends; fewer q/k/v tiles or partials avoid it, "
              f"docs/performance.md)")
    print(b.report)
    print(f"validation took {b.report.seconds:.3f} s")
    if a.save:
        b.program.save(a.save)
        print(f"saved the program to {a.save}")
    return 0 if b.report.ok else 1


# -- fuzz ------------------------------------------------------------------------------------------
def setup_fuzz(p: argparse.ArgumentParser) -> None:
    p.add_argument("--programs", type=count(), default=200, metavar="N",
                   help="programs to mutate and validate (default: 200)")
    p.add_argument("--seed", type=count(0), default=0, metavar="S", help="fuzzer seed (default: 0)")


def cmd_fuzz(a: argparse.Namespace) -> int:
    """Mutate valid programs and validate them; exit 1 if the validator accepted an unsafe one."""
    from megavm.fuzz import fuzz
    r = fuzz(a.programs, a.seed)
    print(f"made {r.made}, rejected {r.rejected}, accepted {r.accepted}, unsafe accepted {r.unsafe_accepted}")
    width = max(map(len, r.by_kind), default=0)
    for kind, v in sorted(r.by_kind.items()):
        print(f"  {kind:<{width}}  " + (", ".join(f"{k} {n}" for k, n in v.items()) if isinstance(v, dict) else str(v)))
    for what in getattr(r, "unsafe", [])[:20]:
        print(f"  unsafe accepted: {what}")
    print("FAIL the validator accepted unsafe programs" if r.unsafe_accepted else "PASS no unsafe program accepted")
    return 1 if r.unsafe_accepted else 0


# -- info ------------------------------------------------------------------------------------------
def setup_info(p: argparse.ArgumentParser) -> None:
    pass


def cmd_info(a: argparse.Namespace) -> int:
    """The model presets."""
    cols = ("preset", "family", "dim", "layers", "heads", "kv", "head_dim", "ffn", "vocab", "tied", "params", "bf16 GB")
    rows = []
    for name, c in PRESETS.items():
        n = sum(torch.Size(s).numel() for s in hf_shapes(c).values())
        rows.append((name, c.family, c.dim, c.n_layers, c.n_heads, c.n_kv_heads, c.head_dim, c.ffn_dim, c.vocab,
                     "yes" if c.tied_embeddings else "no", f"{n / 1e6:.1f}M", f"{2 * n / 1e9:.2f}"))
    _table(cols, rows)
    cols = ("DLRM preset", "dense", "bottom", "tables", "rows", "dim", "interaction", "top", "f32 GB")
    rows = [(name, c.dense, "-".join(map(str, c.bottom)), c.n_sparse, f"{sum(c.tables):,}", c.dim, c.interaction,
             "-".join(map(str, c.top)), f"{dlrm_cli.weight_bytes(c, 'f32') / 1e9:.2f}")
            for name, c in DLRM_PRESETS.items()]
    print()
    _table(cols, rows)
    return 0


def _table(cols: tuple, rows: list[tuple]) -> None:
    widths = [max(len(str(r[i])) for r in rows + [cols]) for i in range(len(cols))]
    for r in [cols] + rows:
        print("  ".join(str(v).rjust(w) if i > 1 else str(v).ljust(w) for i, (v, w) in enumerate(zip(r, widths))))


Setup = Callable[[argparse.ArgumentParser], None]
Handler = Callable[[argparse.Namespace], int]
COMMANDS: dict[str, tuple[Setup, Handler]] = {
    "run": (setup_run, cmd_run),
    "validate": (setup_validate, cmd_validate),
    "fuzz": (setup_fuzz, cmd_fuzz),
    "info": (setup_info, cmd_info),
    "bench": (setup_bench, cmd_bench),
    "trace": (setup_trace, cmd_trace),
    "tune": (setup_tune, cmd_tune),
    "quantize": (setup_quantize, cmd_quantize),
}


def parser() -> argparse.ArgumentParser:
    top = Parser(prog="megavm", description="A persistent cooperative megakernel VM for batch-1 decode.")
    sub = top.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (setup, handler) in COMMANDS.items():
        doc = (handler.__doc__ or "").strip().splitlines()[0] if handler.__doc__ else ""
        p = sub.add_parser(name, help=doc, description=doc)
        setup(p)
        p.set_defaults(handler=handler)
    return top


def steady_host_memory() -> None:
    """Fix glibc's mmap threshold at its default (128 KiB). A decode allocates buffers that grow by one
    position a step; with glibc's dynamic threshold each freed one stays on the heap, and a long CPU
    decode's memory grows with the square of its length (14 GB after 15k steps of the tiny model)."""
    import ctypes
    import ctypes.util
    try:
        ctypes.CDLL(ctypes.util.find_library("c")).mallopt(-3, 128 * 1024)     # M_MMAP_THRESHOLD
    except (OSError, AttributeError, TypeError):
        pass                                                                  # not glibc: nothing to fix


def main(argv: list[str] | None = None) -> int:
    steady_host_memory()
    try:
        args = parser().parse_args(argv)
    except SystemExit as e:         # --help, or a usage error already reported in one line
        return e.code if isinstance(e.code, int) else 2
    try:
        return args.handler(args)
    except UserError as e:
        print(f"megavm {args.command}: error: {e}", file=sys.stderr)
        return 2
    except OSError as e:            # a path the user gave (or the cache folder) cannot be read or written
        print(f"megavm {args.command}: error: {e.strerror or e}{f': {e.filename}' if e.filename else ''}",
              file=sys.stderr)
        return 2
    except ValidationError as e:
        print(f"FAIL program is invalid: {e}")
        return 1
    except RunError as e:
        print(f"FAIL {type(e).__name__}: {e}")
        return 1
    except MegavmError as e:        # the megakernel cannot be built or loaded here
        print(f"megavm {args.command}: error: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    except Exception:
        print(f"megavm {args.command}: internal error, a bug in megavm (please report it with this traceback):",
              file=sys.stderr)
        traceback.print_exc()
        return 3


if __name__ == "__main__":
    sys.exit(main())
