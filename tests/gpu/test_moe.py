"""Mixture-of-experts decode on the GPU: the router, the late-bound expert streams and the weighted
expert sum of the megakernel against ReferenceVM (marker: cuda)."""
from dataclasses import replace

import pytest
import torch

from megavm.core.errors import DeviceError, UserError
from megavm.core.limits import CONSUMER_THREADS
from megavm.instructions import expert_down
from megavm.schedule.config import ScheduleConfig
from megavm.schedule.models import ModelConfig
from megavm.vm.compile import compile
from megavm.vm.megakernel import Ablations, MegakernelVM
from megavm.vm.reference import ReferenceVM
from tests.gpu.harness import rel_err, written
from tests.programs import ROUTE_K, ROUTE_MODES, random_program_weights, route_logits, route_program

pytestmark = pytest.mark.cuda

TOL = {"f32": 1e-4, "bf16": 2e-3}       # relative L2 error of each written f32 buffer against ReferenceVM
# experts of rows straddling ring stages (K = 200 bf16 = 400 bytes), a dense layer, 16 experts choose 4
MOE = ModelConfig(dim=256, n_layers=3, n_heads=4, n_kv_heads=2, head_dim=64, ffn_dim=384, vocab=1000,
                  family="qwen3_moe", qk_norm=True, n_experts=16, top_k=4, expert_ffn=200, router_renorm=False,
                  dense_layers=(1,))
# DeepSeek-V4's block: sqrt-softplus with a ranking bias, the first MoE layer hash-routed, a shared
# expert, the swiglu clamp, routed scaling
V4 = replace(MOE, router_score="sqrt_softplus", router_bias=True, router_renorm=True, router_eps=1e-20,
             router_scale=1.5, hash_layers=1, shared_ffn=128, swiglu_limit=0.6)
MIXTRAL = ModelConfig(dim=2048, n_layers=2, n_heads=16, n_kv_heads=4, head_dim=128, ffn_dim=2048, vocab=1000,
                      family="mixtral", n_experts=8, top_k=2, expert_ffn=2048)


def random_weights(packed, seed: int = 0) -> dict[str, torch.Tensor]:
    """Every weight buffer drawn on the GPU (tests/programs.py: random_program_weights)."""
    return random_program_weights(packed, seed, device="cuda")


def _check(cfg, sc, n_sms, ablations=Ablations(), steps=range(0, 40, 3)):
    packed = compile(cfg, replace(sc, n_sms=n_sms))
    w = random_weights(packed, seed=5)
    gpu, ref = MegakernelVM(packed, w, ablations=ablations), ReferenceVM(packed, w, device="cuda")
    tok, chosen = 7, set()
    for pos in steps:
        res = gpu.run({"token": tok, "pos": pos})
        out = ref.step({"token": tok, "pos": pos})
        for b in written(packed):
            name = packed.names[b]
            if name.startswith("expert_ids"):
                assert torch.equal(gpu.t[b], ref.t[b]), f"{pos=} {name}: {gpu.t[b].tolist()} != {ref.t[b].tolist()}"
                chosen.add(tuple(gpu.t[b].tolist()))
            elif gpu.t[b].is_floating_point():
                err = rel_err(gpu.t[b], ref.t[b])
                assert err <= TOL[sc.dtype], f"{pos=} buffer {name}: {err=:.2e}"
        assert res.token == int(out["next_token"][0]), f"{pos=}"
        tok = res.token
    assert len(chosen) > 3, f"the router chose the same experts every step: {chosen}"


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("n_sms", [5, 0])
def test_moe_every_written_buffer_matches_reference(dtype, n_sms):
    """ROUTE, EXPERT_GLU and EXPERT_DOWN (and a dense layer between MoE layers): every buffer after
    each of several steps, ids exact, against ReferenceVM; on 5 SMs (long queues, each loader waiting
    on a router while its block still works) and on every SM."""
    n = n_sms or torch.cuda.get_device_properties(0).multi_processor_count
    _check(MOE, ScheduleConfig(dtype=dtype, capacity=64), n)


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_v4_block_every_written_buffer_matches_reference(dtype):
    """The DeepSeek-V4-style block (tests/schedule/test_moe_v4.py holds it to transformers on the CPU):
    hash-routed and biased routers, the shared expert's tiles and stream, the clamp."""
    _check(V4, ScheduleConfig(dtype=dtype, capacity=64), torch.cuda.get_device_properties(0).multi_processor_count)


def test_moe_direct_loads_and_mixtral_shape():
    """The direct-loads ablation reads the chosen experts itself (no loader); a Mixtral-shaped layer
    (8 experts, top 2, rows of whole 4 KiB chunks: the register GEMV path)."""
    n = torch.cuda.get_device_properties(0).multi_processor_count
    _check(MOE, ScheduleConfig(dtype="bf16", capacity=64), n, Ablations(direct_loads=True), steps=range(0, 12, 3))
    _check(MIXTRAL, ScheduleConfig(dtype="bf16", capacity=64), n)


@pytest.mark.parametrize("shape", ["p2", "p3", "p4"])
def test_expert_down_pairs_shapes(shape):
    """EXPERT_DOWN's two-experts-a-trip GEMV (gemv_experts_pairs) at 2, 3 and 4 pieces a lane, with rows
    of a warp's second row (12 and 16 rows a tile on 132 SMs), runs that straddle ring stages (up to
    16.3 KB), the last piece of a lane partial (F / 8 not a multiple of 32) and an odd top-k (the last
    expert alone): every written buffer against ReferenceVM."""
    cfg = {"p2": replace(MOE, dim=1536, n_heads=12, head_dim=128, expert_ffn=320, top_k=4),
           "p3": replace(MOE, dim=2048, n_heads=16, n_kv_heads=4, head_dim=128, expert_ffn=744, top_k=5),
           "p4": replace(MOE, dim=1024, n_heads=8, head_dim=128, expert_ffn=1016, top_k=3)}[shape]
    n = torch.cuda.get_device_properties(0).multi_processor_count
    ins = compile(cfg, ScheduleConfig(dtype="bf16", capacity=64, n_sms=n)).instrs
    rows = ins["params"][ins["opcode"] == expert_down.SPEC.code][:, 1]   # (row0, nrows)
    assert 0 < rows.max() <= 2 * CONSUMER_THREADS // 32, f"{shape}: tiles of {rows.max()} rows miss the pairs' path"
    _check(cfg, ScheduleConfig(dtype="bf16", capacity=64), n, steps=range(0, 24, 3))


def test_moe_token_loop_matches_host_loop():
    """generate() with the in-kernel token loop picks the same tokens as one launch per token."""
    n = torch.cuda.get_device_properties(0).multi_processor_count
    packed = compile(MOE, ScheduleConfig(dtype="bf16", capacity=64, n_sms=n))
    w = random_weights(packed, seed=9)
    loop = MegakernelVM(packed, w).generate([3, 14, 15], 20)
    host = MegakernelVM(packed, w, ablations=Ablations(host_loop=True)).generate([3, 14, 15], 20)
    assert loop == host


@pytest.mark.parametrize("experts", [64, 200])
def test_route_modes_match_reference(experts):
    """ROUTE in every mode (softmax, renormalised; sigmoid with bias, groups, eps and scale;
    sqrt-softplus with bias; hash table) on the GPU against ReferenceVM: ids exact, weights within
    1e-5 relative, on random logits and on the adversarial rows of route_logits (all ties, every score
    underflowing to 0, equal pairs, one huge logit). 64 experts take the kernel's register path where
    it applies (no groups, no hash table), 200 its shared-memory path in every mode."""
    packed = route_program(experts, ROUTE_K, 40)
    w = {k: v.cuda() for k, v in route_logits(40, experts).items()}
    gpu, ref = MegakernelVM(packed, w), ReferenceVM(packed, w, device="cuda")
    for tok in range(40):
        gpu.run({"token": tok})
        out = ref.step({"token": tok})
        for name, *_ in ROUTE_MODES:
            ids, want = gpu.buffer(f"ids.{name}"), out[f"ids.{name}"]
            assert torch.equal(ids, want), f"{tok=} {name}: {ids.tolist()} != {want.tolist()}"
            got, exp = gpu.buffer(f"weights.{name}"), out[f"weights.{name}"]
            assert torch.isfinite(got).all() and (got - exp).abs().max() <= 1e-5 * max(1.0, exp.abs().max()), \
                f"{tok=} {name}: {got.tolist()} != {exp.tolist()}"


def test_hash_table_ids_refused_at_load_and_trapped_in_kernel():
    """A hash table naming expert 99 of 64: refused in one line when the weights are bound; forced
    past that check into the kernel, the ROUTE task fails the launch with the id named."""
    packed = route_program(64, ROUTE_K, 40)
    w = {k: v.cuda() for k, v in route_logits(40, 64).items()}
    w["hash_table"][7, 2] = 99
    with pytest.raises(UserError, match="expert id 99 at token 7, slot 2"):
        MegakernelVM(packed, w)
    w["hash_table"][7, 2] = 0
    gpu = MegakernelVM(packed, w)
    gpu.buffer("hash_table")[7, 2] = 99
    gpu.run({"token": 6}).wait()
    with pytest.raises(DeviceError, match="expert id 99 outside the 64 experts"):
        gpu.run({"token": 7}).wait()


def test_decode_op_in_compiled_function():
    """torch.ops.megavm.decode over a MegakernelVM inside torch.compile(fullgraph=True) with Inductor,
    the router operator after it: the same tokens as the VM run directly."""
    from megavm.instructions.routing import route_op
    from megavm.vm.torch_ops import register, release
    n = torch.cuda.get_device_properties(0).multi_processor_count
    packed = compile(MOE, ScheduleConfig(dtype="bf16", capacity=64, n_sms=n))
    w = random_weights(packed, seed=2)
    direct, inside = MegakernelVM(packed, w), MegakernelVM(packed, w)
    h = register(inside)

    @torch.compile(fullgraph=True)
    def step(tok, pos):
        logits, nxt = torch.ops.megavm.decode(h, tok, pos)
        ids, _ = route_op(logits[:16] * 2.0, 4, "softmax")
        return nxt, ids

    tok = 5
    try:
        for pos in range(6):
            nxt, ids = step(torch.tensor([tok], device="cuda"), torch.tensor([pos], device="cuda"))
            res = direct.run({"token": tok, "pos": pos})
            assert int(nxt[0]) == res.token
            assert ids.tolist() == torch.topk(res.logits[:16], 4).indices.tolist()
            tok = res.token
    finally:
        release(h)


def test_expert_h_tagged_against_counter_wait():
    """EXPERT_GLU's h tagged and EXPERT_DOWN polling it (the default) against the GLU tiles' counter wait
    (tag_expert_h=False): the same sums, bit for bit, after each of several steps; and a layer whose k F
    words do not fit xs at once (top 8 of width 2304: one vector at a time, each polled) against ReferenceVM."""
    n = torch.cuda.get_device_properties(0).multi_processor_count
    sc = ScheduleConfig(dtype="bf16", capacity=64, n_sms=n)
    tagged, plain = compile(MOE, sc), compile(MOE, replace(sc, tag_expert_h=False))
    h = tagged.names.index("expert_h.0")
    assert tagged.buffers[h]["flags"] != plain.buffers[h]["flags"], "tag_expert_h changed no buffer's flags"
    w = random_weights(tagged, seed=5)
    a, b = MegakernelVM(tagged, w), MegakernelVM(plain, w)
    tok = 7
    for pos in range(0, 24, 3):
        ra, rb = a.run({"token": tok, "pos": pos}), b.run({"token": tok, "pos": pos})
        for i in written(tagged):
            assert torch.equal(a.t[i], b.t[i]), f"{pos=} {tagged.names[i]}: tagged h and the counter wait differ"
        assert ra.token == rb.token
        tok = ra.token
    wide = replace(MIXTRAL, n_experts=16, top_k=8, expert_ffn=2304)
    assert wide.top_k * wide.expert_ffn > expert_down.REG_MAX_K, "the wide layer fits xs at once"
    _check(wide, ScheduleConfig(dtype="bf16", capacity=64), n, steps=range(0, 9, 3))
