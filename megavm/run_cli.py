"""`megavm run`: decode through the VM (the megakernel on a GPU, ReferenceVM on the CPU), greedy or
sampled, each step checked against the eager model and ReferenceVM; a DLRM program's batches
(megavm/dlrm_cli.py). Also the model and device helpers other subcommands share."""
from __future__ import annotations

import argparse
import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from megavm import dlrm_cli
from megavm.args import DEVICES, add_model_args, add_program_args, count
from megavm.core.errors import RunError, UserError
from megavm.core.memory import host_bytes_available, require
from megavm.dlrm_cli import is_dlrm
from megavm.schedule.config import KV_FORMATS, ScheduleConfig
from megavm.schedule.footprint import footprint, require_attention_split
from megavm.vm.sizing import describe as describe_build


def resolve_device(name: str) -> str:
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise UserError("--device cuda, but torch sees no CUDA device")
    return name


def default_sms(device: str) -> int:
    return torch.cuda.get_device_properties(0).multi_processor_count if device == "cuda" else 8


def parse_prompt(text: str, vocab: int) -> list[int]:
    try:
        prompt = [int(t, 10) for t in text.split(",") if t.strip()]
    except ValueError:
        raise UserError(f"--prompt {text[:80]!r}: expected comma-separated token ids such as 1,2,3") from None
    if not prompt:
        raise UserError("--prompt is empty")
    bad = [t for t in prompt if not 0 <= t < vocab]
    if bad:
        raise UserError(f"--prompt token ids {bad[:8]} are outside the vocabulary [0, {vocab})")
    return prompt


def model_config(a: argparse.Namespace):
    """(config, dtype, name) of --checkpoint or --model, the weights not yet read."""
    from megavm.schedule.checkpoint import config_dtype, read_config
    from megavm.schedule.models import preset
    from megavm.schedule.source import default_dtype
    if a.batch is not None:
        raise UserError(f"--batch is a DLRM program's setting; {a.checkpoint or a.model} is a batch-1 decoder")
    if a.checkpoint:
        return read_config(a.checkpoint), a.dtype or config_dtype(a.checkpoint), a.checkpoint
    return preset(a.model), a.dtype or default_dtype(a.model), a.model


def describe(name: str, cfg, dtype: str) -> str:
    return (f"{name}: dim {cfg.dim}, {cfg.n_layers} layers, {cfg.n_heads}/{cfg.n_kv_heads} heads of {cfg.head_dim}, "
            f"ffn {cfg.ffn_dim}, vocab {cfg.vocab}{', tied' if cfg.tied_embeddings else ''}, {dtype}")


# -- run -------------------------------------------------------------------------------------------
def setup_run(p: argparse.ArgumentParser) -> None:
    add_model_args(p)
    add_program_args(p, "prompt + tokens rounded up to 64")
    p.add_argument("--tokens", type=count(), default=32, metavar="N", help="tokens to generate (default: 32)")
    p.add_argument("--prompt", default="1", metavar="IDS", help="comma-separated prompt token ids (default: 1)")
    p.add_argument("--seeds", type=count(0), default=0, metavar="N",
                   help="also decode under N seeded random interleavings, in checking mode (default: 0)")
    p.add_argument("--device", default="auto", choices=DEVICES, help="auto: cuda when available (default: auto)")
    p.add_argument("--out", metavar="FILE.npz",
                   help="save the decode: prompt, tokens and every step's logits [positions, vocab] (f32) of the "
                        "VM that ran it (the megakernel on a GPU), for comparison with another implementation "
                        "(a DLRM program: each batch's dense, sparse and prob)")
    p.add_argument("--batches", type=count(), default=4, metavar="N",
                   help="random batches a DLRM program runs, each checked against torch (default: 4)")
    p.add_argument("--adapter", action="append", default=[], metavar="DIR",
                   help="a PEFT LoRA adapter folder (repeatable): adapter ids 1, 2, ... in the order given")
    p.add_argument("--adapter-id", type=count(0), default=None, metavar="N",
                   help="the adapter every step runs with, a runtime input (0: none; default: 1 with --adapter)")
    p.add_argument("--kv-cache", choices=tuple(f for f in KV_FORMATS if f), default=None,
                   help="store the KV cache quantized, by amax -> quantize tasks: fp8, e4m3 codes with a scale per "
                        "position; nvfp4, e2m1 codes with an e4m3 scale per 16 elements and a scale per position "
                        "(head_dim a multiple of 32) (default: the weights' dtype)")
    p.add_argument("--untuned", action="store_true",
                   help="the default schedule, not the best one `megavm tune` recorded for this model and GPU")
    p.add_argument("--temperature", type=float, default=None, metavar="T",
                   help="sample the tokens inside the kernel instead of greedy decoding (0: greedy through the sampler)")
    p.add_argument("--top-k", type=count(0), default=0, metavar="K", help="sample among the K most likely (0: all)")
    p.add_argument("--top-p", type=float, default=1.0, metavar="P", help="sample within top-p probability mass")
    p.add_argument("--seed", type=count(0), default=0, metavar="S",
                   help="the sampler's seed: the same seed gives the same tokens (default: 0)")


def sampling_args(a: argparse.Namespace, vocab: int) -> tuple[float, int, float, int] | None:
    """(temperature, top_k, top_p, seed) of --temperature and its company, checked; None for greedy."""
    if a.temperature is None:
        if a.top_k or a.top_p != 1.0 or a.seed:
            raise UserError("--top-k, --top-p and --seed take effect with --temperature")
        return None
    from megavm.instructions.sampling import check_kernel_params
    try:
        check_kernel_params(a.temperature, a.top_k, a.top_p, vocab)
    except ValueError as e:
        raise UserError(f"sampling: {e}") from None
    if a.seed >= 1 << 31:
        raise UserError(f"--seed {a.seed} must be below 2^31")
    return a.temperature, a.top_k, a.top_p, a.seed


def load_adapters(a: argparse.Namespace, cfg, sc: ScheduleConfig):
    """(adapters, the id the run uses, the schedule with room for them) of --adapter and --adapter-id."""
    from megavm.schedule.adapters import TARGETS, load_adapter
    adapters = [load_adapter(d, cfg) for d in a.adapter]
    aid = (1 if adapters else 0) if a.adapter_id is None else a.adapter_id
    if aid > len(adapters):
        raise UserError(f"--adapter-id {aid}: {len(adapters)} adapters are loaded (ids 0..{len(adapters)})")
    if not adapters:
        return adapters, aid, sc
    targets = tuple(t for t in TARGETS if any(t in x.targets for x in adapters))
    return adapters, aid, replace(sc, lora_adapters=len(adapters), lora_rank=max(x.rank for x in adapters),
                                  lora_targets=targets)


def writable_file(path: str, suffix: str) -> Path:
    """An output file's path, checked before any work: its suffix, and a directory that exists."""
    out = Path(path)
    if out.suffix != suffix:
        raise UserError(f"--out {path}: the file name must end in {suffix}")
    if not out.parent.is_dir():
        raise UserError(f"--out {path}: directory {str(out.parent)!r} does not exist")
    if out.is_dir():
        raise UserError(f"--out {path} is a directory")
    return out


def save_decode(out: Path, d, vm: str) -> None:
    np.savez(out, prompt=np.asarray(d.prompt, np.int64), tokens=np.asarray(d.tokens, np.int64),
             logits=torch.stack(d.logits).numpy().astype(np.float32), vm=np.asarray(vm))


def default_capacity(n_positions: int) -> int:
    return max(64, 64 * math.ceil(n_positions / 64))


def require_run(cfg, sc: ScheduleConfig, steps: int, decodes: int, device: str) -> None:
    """Refuse a run that cannot fit: the program, the weights (and their program copies), the KV caches
    and activations of the VM and the eager model, and the logits each decode keeps of every step."""
    fp = footprint(cfg, sc)
    host = {"compiling the program": fp.compile_bytes, "logits kept": 4 * cfg.vocab * steps * decodes}
    if device == "cuda":
        free, _ = torch.cuda.mem_get_info()
        require("this run", {"weights": 3 * fp.weight_bytes, "KV caches": 3 * fp.kv_bytes,
                             "activations": 2 * fp.arena_bytes}, free, "GPU memory")
        host["weights"] = fp.weight_bytes                 # read or drawn on the host first
    else:
        host.update({"weights": 2 * fp.weight_bytes, "KV caches": 2 * fp.kv_bytes, "activations": fp.arena_bytes})
    require("this run", host, host_bytes_available(), "host memory")
    require_attention_split(cfg, sc)


def cmd_run(a: argparse.Namespace) -> int:
    """Decode through the VM, greedy or sampled; check every step against the eager model (exit 1 on
    mismatch)."""
    from megavm.schedule.source import load_model
    from megavm.schedule.weights import program_weights, stored_exactly
    from megavm.vm.compile import compile
    from megavm.vm.reference import ReferenceVM
    from megavm.vm.verify import (VS_EAGER, VS_REFERENCE, FollowKVCodes, compare, compare_following, eager_decode,
                                  eager_step, greedy, greedy_along, megakernel_step, reference_step)

    device = resolve_device(a.device)
    out = a.out and writable_file(a.out, ".npz")
    if is_dlrm(a):
        if a.adapter or a.adapter_id is not None:
            raise UserError("--adapter and --adapter-id are a decoder's settings, not a DLRM program's")
        return dlrm_cli.run(a, device, a.sms or default_sms(device), out)
    cfg, dt, _ = model_config(a)
    prompt = parse_prompt(a.prompt, cfg.vocab)
    positions = len(prompt) + a.tokens - 1
    capacity = a.capacity or default_capacity(positions)
    if capacity < positions:
        raise UserError(f"--capacity {capacity} is below the {positions} positions that prompt + tokens need")
    sampling = sampling_args(a, cfg.vocab)
    sc = ScheduleConfig(dtype=dt, capacity=capacity, n_sms=a.sms or default_sms(device), strategy=a.strategy,
                        sample=sampling is not None, kv_cache=a.kv_cache or "")
    require_run(cfg, sc, a.tokens + len(prompt), 2 + a.seeds + (device == "cuda"), device)
    adapters, aid, sc = load_adapters(a, cfg, sc)
    extra = {"adapter": aid} if adapters else {}
    if sampling:
        extra |= {"sampling": torch.tensor(sampling[:3], dtype=torch.float32), "seed": sampling[3]}
        print(f"sampling: temperature {sampling[0]:g}, top_k {sampling[1]}, top_p {sampling[2]:g}, seed {sampling[3]}"
              " (each token against the sampling spec on the VM's own logits; the other models follow its tokens)")
    model = load_model(a.model, a.checkpoint, a.dtype)
    dt, n_sms = model.dtype, sc.n_sms          # a checkpoint's tensors decide its dtype
    print(describe(model.name, cfg, dt))
    for note in model.notes:
        print(f"note: {note}")

    for i, x in enumerate(adapters, start=1):
        print(f"adapter {i}: {x.path}: rank {x.rank}, scale {x.scale:g}, on {','.join(x.targets)}"
              f"{'  <- this run' if i == aid else ''}")
    defines = {}
    if device == "cuda" and not a.untuned and (model.weights or sc.kv_cache):
        stored_as = " and ".join(x for x in (model.weights and f"{model.weights} weights",
                                             sc.kv_cache and f"an {sc.kv_cache} KV cache") if x)
        print(f"schedule: defaults (the tuner's corpus has no configurations with {stored_as}; its configurations "
              f"are for {dt} ones)")
    elif device == "cuda" and not a.untuned:
        from megavm.core.errors import ConfigError
        from megavm.flywheel.prior import tuned
        from megavm.schedule.lora_layout import LoraLayout
        tsc, tdefines, chosen = tuned(cfg, dt, sc, torch.cuda.get_device_name(0), len(prompt))
        tsc = replace(tsc, sample=sc.sample)
        try:
            LoraLayout.of(cfg, replace(tsc, dtype=dt))         # adapters need some fusions the tuner may undo
            sc, defines = tsc, tdefines
        except ConfigError as e:
            chosen = f"schedule: defaults (the tuned configuration does not take the adapters: {e})"
        print(chosen)
    packed = compile(cfg, replace(sc, dtype=dt, weights=model.weights))
    print(f"program: {len(packed.instrs)} tasks, {len(packed.counter_producers)} counters, capacity {capacity}, "
          f"{n_sms} queues ({sc.strategy}); valid")

    weights = program_weights(cfg, model.hf)
    if model.weights:
        weights = stored_exactly(weights, [packed.buffer(i) for i in range(len(packed.buffers))], model.weights)
    if adapters:
        from megavm.schedule.lora_layout import LoraLayout, lora_weights
        weights |= lora_weights(LoraLayout.of(cfg, replace(sc, dtype=dt)), adapters, weights)
    adapter = adapters[aid - 1] if aid else None
    if sampling:
        return sampled_run(a, cfg, packed, weights, model, prompt, capacity, device, adapter, extra, defines,
                           sampling, out, dt)
    eager = eager_decode(model, prompt, a.tokens, capacity, device, adapter, sc.kv_cache)
    tol = VS_EAGER[dt]
    ref = greedy(reference_step(ReferenceVM(packed, weights, device), extra), prompt, a.tokens)
    checks = [compare(f"reference-vm ({device}) vs eager", ref, eager, tol)]
    primary, primary_name = ref, f"reference-vm on {device}"
    if device == "cuda":
        from megavm.vm.megakernel import MegakernelVM
        mk = MegakernelVM(packed, weights, defines=defines or None)
        print(describe_build(mk.defines))
        primary, primary_name = greedy(megakernel_step(mk, extra), prompt, a.tokens), "megakernel"
        # codes of rows that differ in their last bits differ at midpoints, and each such code moves its
        # element by a whole step (a bf16 step, an eighth of it in e4m3, a third in e2m1): the oracle
        # follows the megakernel's codes where they are a valid rounding of its own rows (FollowKVCodes;
        # an f32 cache's rows, which nothing rounds, it keeps)
        follow = FollowKVCodes(mk)
        along = greedy_along(eager_step(model, capacity, device, adapter, sc.kv_cache, follow), primary)
        checks.append(compare_following("megakernel vs eager", primary, along, tol, follow))
        if not sc.kv_cache:
            checks.append(compare("megakernel vs reference-vm", primary, ref, VS_REFERENCE[dt]))
    for s in range(a.seeds):
        try:
            vm = ReferenceVM(packed, weights, device, check=True, seed=s)
            d = greedy(reference_step(vm, extra), prompt, a.tokens)
        except RunError as e:
            print(f"FAIL reference-vm seed {s}: {type(e).__name__}: {e}")
            return 1
        checks.append(compare(f"reference-vm seed {s} (checking mode) vs eager", d, eager, tol))

    print(f"prompt {prompt} -> {len(primary.tokens)} tokens: {' '.join(map(str, primary.tokens))}")
    if out:
        save_decode(out, primary, primary_name)
        print(f"saved {out}: prompt, tokens and logits [{len(primary.logits)}, {cfg.vocab}] of the {primary_name}")
    print(f"{primary_name}: {primary.ms_per_token:.2f} ms/token (median of {len(primary.step_s)} steps); "
          f"eager: {eager.ms_per_token:.2f} ms/token")
    for c in checks:
        print(f"  {'ok  ' if c.ok else 'FAIL'} {c}")
    worst = max(checks, key=lambda c: c.max_err / c.tol.value)
    ok = all(c.ok for c in checks)
    print(f"{'PASS' if ok else 'FAIL'} {worst.tol.describe(worst.max_err)} over {a.tokens} tokens; "
          f"worst of {len(checks)} checks: {worst.name}")
    return 0 if ok else 1


def sampled_run(a, cfg, packed, weights, model, prompt, capacity, device, adapter, extra, defines, sampling, out,
                dt) -> int:
    """A sampled decode: the VM's tokens against the sampling spec on its own logits (a token drawn over
    the whole vocabulary moves with logit differences far below any tolerance, so another model's
    tokens are no oracle), then the eager model and ReferenceVM fed the same tokens, logits within the
    greedy run's tolerance."""
    from megavm.vm.reference import ReferenceVM
    from megavm.vm.verify import VS_EAGER, VS_REFERENCE, FollowKVCodes, compare, compare_following, eager_step, \
        forced, greedy, megakernel_step, reference_step, spec_tokens
    tol, follow = VS_EAGER[dt], None
    if device == "cuda":
        from megavm.vm.megakernel import MegakernelVM
        mk = MegakernelVM(packed, weights, defines=defines or None)
        print(describe_build(mk.defines))
        vm_step, name = megakernel_step(mk, extra), "megakernel"
        follow = FollowKVCodes(mk)                             # cache codes at near-ties (as greedy runs)
    else:
        vm_step, name = reference_step(ReferenceVM(packed, weights, device), extra), f"reference-vm on {device}"
    primary = greedy(vm_step, prompt, a.tokens)            # each step feeds its own (sampled) token on
    eager = forced(eager_step(model, capacity, device, adapter, a.kv_cache or "", follow), prompt, primary.tokens)
    fed = f"{name} vs eager (fed the same tokens)"
    checks = [spec_tokens(f"{name} tokens vs the sampling spec on its logits", primary, sampling),
              compare_following(fed, primary, eager, tol, follow) if follow else compare(fed, primary, eager, tol)]
    if device == "cuda" and not a.kv_cache:             # a quantized cache's codes differ at near-ties
        ref = forced(reference_step(ReferenceVM(packed, weights, device), extra), prompt, primary.tokens)
        checks.append(compare("megakernel vs reference-vm (fed the same tokens)", primary, ref, VS_REFERENCE[dt]))
    print(f"prompt {prompt} -> {len(primary.tokens)} tokens: {' '.join(map(str, primary.tokens))}")
    if out:
        save_decode(out, primary, name)
        print(f"saved {out}: prompt, tokens and logits [{len(primary.logits)}, {cfg.vocab}] of the {name}")
    print(f"{name}: {primary.ms_per_token:.2f} ms/token (median of {len(primary.step_s)} steps)")
    for c in checks:
        print(f"  {'ok  ' if c.ok else 'FAIL'} {c}")
    worst = max(checks[1:], key=lambda c: c.max_err / c.tol.value)
    ok = all(c.ok for c in checks)
    print(f"{'PASS' if ok else 'FAIL'} {worst.tol.describe(worst.max_err)} over {a.tokens} tokens; sampled tokens "
          f"{'are' if checks[0].ok else 'are NOT'} the spec's")
    return 0 if ok else 1


# -- validate --------------------------------------------------------------------------------------
