"""The decode step as a torch operator: `megavm::decode(handle, token, pos) -> (logits, next_token)`,
with a fake (meta) implementation, so a torch.compile'd function can call a loaded megavm program
(and the router operators of instructions/routing.py) without graph breaks. The operator is opaque to
Dynamo and Inductor: one node, its output shapes from the fake implementation.

    vm = MegakernelVM(packed, weights)              # or ReferenceVM(packed, weights)
    h = register(vm)
    logits, nxt = torch.ops.megavm.decode(h, token, pos)

token and pos are int tensors of one element (on any device: the operator reads them on the host,
one synchronisation per step, as a launch needs them by value). Each call is a decode step: it appends
to the KV cache. The returned tensors are copies, so later steps do not change them.
"""
from __future__ import annotations

import itertools

import torch

from megavm.core.errors import InputError

_VMS: dict[int, object] = {}
_NEXT = itertools.count(1)


def register(vm) -> int:
    """A handle for a MegakernelVM or ReferenceVM, for torch.ops.megavm.decode."""
    h = next(_NEXT)
    _VMS[h] = vm
    return h


def release(handle: int) -> None:
    _VMS.pop(handle, None)


def _vm(handle: int):
    try:
        return _VMS[handle]
    except KeyError:
        raise InputError(f"no megavm program is registered under handle {handle}") from None


def _logits_shape(vm) -> tuple[int, ...]:
    p = vm.p
    return p.shape(p.buffer_id("logits"))


@torch.library.custom_op("megavm::decode", mutates_args=())
def decode(handle: int, token: torch.Tensor, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One decode step of the program registered under handle: (logits f32, next token int32 [1])."""
    vm = _vm(handle)
    inputs = {"token": int(token.reshape(-1)[0]), "pos": int(pos.reshape(-1)[0])}
    if hasattr(vm, "run"):                        # MegakernelVM
        res = vm.run(inputs)
        return res.logits.clone(), vm.buffer("next_token").clone()
    out = vm.step(inputs)                         # ReferenceVM
    return out["logits"].clone(), out["next_token"].clone()


@decode.register_fake
def _(handle, token, pos):
    vm = _vm(handle)
    dev = vm.buffer("logits").device
    return (torch.empty(_logits_shape(vm), dtype=torch.float32, device=dev),
            torch.empty((1,), dtype=torch.int32, device=dev))
