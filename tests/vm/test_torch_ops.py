"""The decode step and the router as torch operators inside torch.compile(fullgraph=True): no graph
breaks, the same tokens as calling the VM directly."""
import torch

from megavm.instructions.routing import route_op
from megavm.schedule.config import ScheduleConfig
from megavm.schedule.models import PRESETS
from megavm.vm.compile import compile
from megavm.vm.reference import ReferenceVM
from megavm.vm.torch_ops import register, release
from tests.programs import random_program_weights


def test_decode_and_route_compile_without_graph_breaks():
    packed = compile(PRESETS["moe-tiny"], ScheduleConfig(dtype="f32", capacity=16, n_sms=4))
    w = random_program_weights(packed)
    direct, inside = ReferenceVM(packed, w), ReferenceVM(packed, w)
    h = register(inside)

    @torch.compile(fullgraph=True, backend="aot_eager")
    def step(tok, pos):
        logits, nxt = torch.ops.megavm.decode(h, tok, pos)
        ids, weights = route_op(logits[:16], 4, "softmax")       # a second custom op on the step's output
        return nxt, ids, weights

    tok = 3
    try:
        for pos in range(5):
            nxt, ids, weights = step(torch.tensor([tok]), torch.tensor([pos]))
            want = direct.step({"token": tok, "pos": pos})
            assert int(nxt[0]) == int(want["next_token"][0])
            assert ids.tolist() == torch.topk(want["logits"][:16], 4).indices.tolist()
            assert torch.allclose(weights.sum(), torch.tensor(1.0))
            tok = int(nxt[0])
    finally:
        release(h)
