"""xs and the ring sized to the program (vm/sizing.py): each task's stated need, the program's, the
build knobs chosen from it, and the programs that keep the default build."""
import pytest

from megavm.core.limits import CONSUMER_THREADS, MAX_K, MAX_TILE_ROWS, STAGE_BYTES
from megavm.schedule.assign import assign
from megavm.schedule.config import ScheduleConfig
from megavm.schedule.lower import lower
from megavm.schedule.models import PRESETS, ModelConfig
from megavm.vm.pack import pack
from megavm.instructions.tiles import PART_FLOATS
from megavm.vm.sizing import TIERS, describe, ring_defines, xs_need

ODD = ModelConfig(dim=384, n_layers=2, n_heads=6, n_kv_heads=2, head_dim=128, ffn_dim=1000, vocab=777,
                  qk_norm=True, family="qwen3")


def _program(cfg, **kw):
    return lower(cfg, ScheduleConfig(**{"dtype": "bf16", "capacity": 64, "n_sms": 8, **kw}))


@pytest.mark.parametrize("name,ffn_k,want", [("small", 2816, (8192, 12)), ("llama-1b", 8192, (12288, 11)),
                                             ("qwen3-1.7b", 6144, (8192, 12))])
def test_presets_take_the_smallest_tier_that_holds_their_largest_gemv(name, ffn_k, want):
    p = _program(PRESETS[name], capacity=128)
    need = xs_need(p)
    # the down projection's K and the GEMV's per-warp sums: every other task needs less
    assert need == ffn_k + PART_FLOATS
    assert ring_defines(need) == {"MEGAVM_MAX_K": want[0], "MVM_STAGES": want[1]}


def test_a_need_above_every_smaller_tier_keeps_the_default_build():
    p = _program(PRESETS["gemma-2b"])                 # ffn 16384: the row-per-warp GEMV over all of xs
    assert xs_need(p) > TIERS[-2][0] and ring_defines(xs_need(p)) == {}
    assert ring_defines(12289) == {} and ring_defines(12288) == {"MEGAVM_MAX_K": 12288, "MVM_STAGES": 11}
    assert ring_defines(None) == {}


def test_finishers_partials_and_combines_state_their_scratch():
    from megavm.instructions import spec
    from megavm.instructions.attention import combine_scratch, partial_scratch
    p = _program(ODD, capacity=256, kv_block=64, attn_direct=False)
    seen = set()
    for i, t in enumerate(p.tasks):
        s, (ins, outs) = spec(t.opcode), p.operands(i)
        n = s.shared(t.params, ins, outs)
        if s.name in ("ROPE", "KV_APPEND"):
            assert n == 2 * t.params["head_dim"] + t.params["nrows"]
        elif s.name == "ATTN_PARTIAL":
            assert n == partial_scratch(ODD.group, 128, 64, ins[1].dtype)
        elif s.name == "ATTN_COMBINE":
            assert n == combine_scratch(1, 4, ODD.group)
        seen.add(s.name)
        assert n is not None and n <= MAX_K
    assert {"ROPE", "KV_APPEND", "ATTN_PARTIAL", "ATTN_COMBINE"} <= seen


def test_packed_weights_state_their_need():
    for weights in ("fp8", "nvfp4", "int4"):
        assert xs_need(_program(PRESETS["small"], weights=weights)) == 2816 + PART_FLOATS, weights


@pytest.mark.parametrize("kw", [dict(kv_cache="fp8"), dict(kv_cache="nvfp4")])
def test_tasks_whose_shared_memory_is_not_stated_keep_the_whole_xs(kw):
    assert xs_need(_program(PRESETS["small"], **kw)) is None


def test_lora_keeps_the_whole_xs():
    p = _program(PRESETS["small"], lora_adapters=2, lora_rank=8, lora_targets=("q", "v"))
    assert xs_need(p) is None


def test_pack_records_the_need_and_program_defines_builds_it(monkeypatch):
    from megavm.vm.megakernel import program_defines
    p = _program(PRESETS["small"])
    packed = pack(p, assign(p, 8))
    assert packed.meta["xs_floats"] == xs_need(p) == 2816 + PART_FLOATS
    assert program_defines(packed, None) == {"MEGAVM_MAX_K": 8192, "MVM_STAGES": 12}
    # a caller's knob that sizes the build keeps the default sizes; other knobs come along
    assert program_defines(packed, {"MEGAVM_MAX_K": MAX_K}) == {"MEGAVM_MAX_K": MAX_K}
    assert program_defines(packed, {"MVM_STAGES": 8}) == {"MVM_STAGES": 8}
    assert program_defines(packed, {"MVM_E2M1_MMA": 1}) == {"MVM_E2M1_MMA": 1}     # its fragments sit above x
    assert program_defines(packed, {"MVM_ATTN_MMA": 0}) == {"MEGAVM_MAX_K": 8192, "MVM_STAGES": 12, "MVM_ATTN_MMA": 0}
    for flags in ("-DMVM_STAGES=9", "-lineinfo -D MVM_STAGES=9", "-DMVM_CONSUMER_WARPS"):
        monkeypatch.setenv("MEGAVM_NVCC_FLAGS", flags)
        assert program_defines(packed, None) is None, flags


def test_tiers_fit_the_block():
    """ring + xs + the rest of mvm_smem (instructions/device.cuh: the GEMV's sums, the reductions and the
    ring's barriers, about 2.3 KiB) within 227 KiB; the kernel's static_assert is the real check, built
    for each tier on the GPU."""
    warps = CONSUMER_THREADS // 32
    for xs, stages in TIERS:
        # ring, xs, acc (2 x MAX_TILE_ROWS), red (2 a warp), the full/empty barriers, abort and inline_next
        total = stages * STAGE_BYTES + 4 * xs + 4 * 2 * MAX_TILE_ROWS + 4 * 2 * warps + 16 * stages + 8
        assert total <= 227 * 1024, (xs, stages, total)


def test_describe_names_the_build():
    assert describe({}) == "shared memory: 16384 floats of xs and 10 ring stages (the defaults)"
    assert describe({"MEGAVM_MAX_K": 12288, "MVM_STAGES": 11, "MVM_ATTN_MMA": 0}) == \
        "shared memory: 12288 floats of xs and 11 ring stages (a tier sized to the program)"
    assert describe({"MVM_STAGES": 8}).endswith("8 ring stages (as set)")


def test_a_caller_xs_below_the_programs_need_is_refused(monkeypatch):
    from megavm.core.errors import UserError
    from megavm.vm.megakernel import program_defines
    p = _program(PRESETS["small"])
    packed = pack(p, assign(p, 8))
    with pytest.raises(UserError, match=r"MEGAVM_MAX_K=4096: the program's tasks use 4864 floats of xs"):
        program_defines(packed, {"MEGAVM_MAX_K": 4096})
    assert program_defines(packed, {"MEGAVM_MAX_K": 4864}) == {"MEGAVM_MAX_K": 4864}
    with pytest.raises(UserError, match="multiple of 4"):
        program_defines(packed, {"MEGAVM_MAX_K": 4866})
    monkeypatch.setenv("MEGAVM_NVCC_FLAGS", "-DMEGAVM_MAX_K=2048")
    with pytest.raises(UserError, match="MEGAVM_MAX_K=2048"):
        program_defines(packed, None)
    monkeypatch.delenv("MEGAVM_NVCC_FLAGS")
    q = _program(PRESETS["small"], kv_cache="fp8")     # states no need: the whole xs
    with pytest.raises(UserError, match=r"the whole xs \(16384 floats"):
        program_defines(pack(q, assign(q, 8)), {"MEGAVM_MAX_K": 12288})
