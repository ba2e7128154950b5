"""xs and the ring sized to the program (vm/sizing.py): each task's stated need, the program's, the
build knobs chosen from it, and the programs that keep the default build."""
import pytest

from megavm.core.types import Buffer, BufferKind, DType
from megavm.core.limits import CONSUMER_THREADS, MAX_K
from megavm.schedule.assign import assign
from megavm.schedule.config import ScheduleConfig
from megavm.schedule.lower import lower
from megavm.schedule.models import PRESETS, ModelConfig
from megavm.vm.pack import pack
from megavm.instructions.tiles import PART_FLOATS, REG_MAX_K
from megavm.vm.sizing import SMEM_BYTES, TIERS, describe, ring_defines, smem_bytes, xs_need

ODD = ModelConfig(dim=384, n_layers=2, n_heads=6, n_kv_heads=2, head_dim=128, ffn_dim=1000, vocab=777,
                  qk_norm=True, family="qwen3")


def _program(cfg, **kw):
    return lower(cfg, ScheduleConfig(**{"dtype": "bf16", "capacity": 64, "n_sms": 8, **kw}))


def _gemvs(p):
    """(K, rows) of each GEMV task: its 2-D weight operand's row length and the task's rows"""
    for i, t in enumerate(p.tasks):
        ws = [b for b in p.operands(i)[0] if b is not None and b.kind == BufferKind.WEIGHT and len(b.shape) == 2]
        if ws and "nrows" in t.params:
            yield ws[0].shape[1], t.params["nrows"]


@pytest.mark.parametrize("name,most,want", [("small", (1024, 244), (4280, 13)), ("llama-1b", (8192, 16), (8380, 12)),
                                            ("qwen3-1.7b", (6144, 16), (8380, 12))])
def test_presets_take_the_smallest_tier_that_holds_their_largest_gemv(name, most, want):
    """small: the LM head's tall tiles; the others: the down projection"""
    p = _program(PRESETS[name], capacity=128, n_sms=132)      # an H100's tiles
    warps = CONSUMER_THREADS // 32
    # K and the per-warp row sums (consumer warps x the tile's rows) of the GEMV that needs most; the
    # partials, combines and finishers need less
    assert max(_gemvs(p), key=lambda kr: kr[0] + warps * kr[1]) == most
    assert xs_need(p) == most[0] + warps * most[1]
    assert ring_defines(xs_need(p)) == {"MEGAVM_MAX_K": want[0], "MVM_STAGES": want[1]}


def test_a_need_above_every_smaller_tier_keeps_the_default_build():
    p = _program(PRESETS["gemma-2b"])                 # ffn 16384: the row-per-warp GEMV (no row sums) over all of xs
    assert xs_need(p) == MAX_K == REG_MAX_K + PART_FLOATS and ring_defines(xs_need(p)) == {}
    assert ring_defines(12481) == {} and ring_defines(12480) == {"MEGAVM_MAX_K": 12480, "MVM_STAGES": 11}
    assert ring_defines(None) == {}


def test_the_tiers_are_the_most_xs_beside_each_ring():
    assert TIERS == ((4280, 13), (8380, 12), (12480, 11), (MAX_K, 10))
    for xs, stages in TIERS:
        assert smem_bytes(xs, stages) <= SMEM_BYTES
        assert xs == MAX_K or smem_bytes(xs + 4, stages) > SMEM_BYTES


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
    """a packed format's x runs lie within K (gemv_core.cuh: xs_index): the same need as bf16's"""
    need = xs_need(_program(PRESETS["small"]))
    assert need == 2816 + CONSUMER_THREADS // 32 * 128       # 8 SMs: down tiles of 128 rows
    for weights in ("fp8", "nvfp4", "int4"):
        assert xs_need(_program(PRESETS["small"], weights=weights)) == need, weights


def test_experts_and_routers_state_their_need():
    """EXPERT_GLU: K and its sums; EXPERT_DOWN: the k vectors at once (k F <= REG_MAX_K) or one at a time,
    and its sums, at least the ids' slots below the most sums; ROUTE: none on its one-warp path, else
    three MAX_EXPERTS arrays and a key a group (hash layers)"""
    from dataclasses import replace

    from megavm.core.limits import MAX_EXPERTS, MAX_TOPK
    from megavm.instructions import spec
    from megavm.instructions.expert_down import shared as down_shared
    v4 = replace(PRESETS["moe-tiny"], router_score="sqrt_softplus", router_bias=True, hash_layers=1, shared_ffn=128)
    warps, seen = CONSUMER_THREADS // 32, {}
    for cfg in (PRESETS["moe-tiny"], v4):
        p = _program(cfg)
        for i, t in enumerate(p.tasks):
            s, (ins, outs) = spec(t.opcode), p.operands(i)
            n = s.shared(t.params, ins, outs) if s.shared else None
            if s.name == "EXPERT_GLU":
                assert n == ins[2].shape[2] + warps * t.params["nrows"]
            elif s.name == "EXPERT_DOWN":
                k, f = ins[0].shape
                assert n == max(max(k * f, ins[5].shape[0] if ins[5] is not None else 0) + warps * t.params["nrows"],
                                PART_FLOATS + 2 * MAX_TOPK)
            elif s.name == "ROUTE":
                big = ins[2] is not None and ins[0] is not None
                assert n == (3 * MAX_EXPERTS + ins[0].shape[0] if big else 0), (cfg.hash_layers, t.params)
            seen[s.name] = seen.get(s.name, 0) + 1
        assert xs_need(p) is not None
    assert {"EXPERT_GLU", "EXPERT_DOWN", "ROUTE"} <= set(seen)
    # k F past REG_MAX_K: one vector at a time
    h = Buffer("h", BufferKind.ACTIVATION, DType.F32, (8, 4096))
    assert down_shared({"nrows": 16}, (h,) + (None,) * 6, ()) == 4096 + warps * 16


def test_every_opcode_states_its_need():
    from megavm.instructions import SPECS
    assert [s.name for s in SPECS.values() if s.shared is None] == []


@pytest.mark.parametrize("kw", [dict(kv_cache="fp8"), dict(kv_cache="nvfp4"), dict(sample=True)])
def test_quantized_appends_and_sampling_state_their_need(kw):
    """KV_QUANT nothing; RMS_LINEAR_AMAX its body's (RMS_LINEAR_KV's) GEMV; SAMPLE the most of its every-token
    draw's 8 floats a consumer thread and the tile maxima, 512 candidates and the tiles that reach them"""
    from megavm.instructions import spec
    p = _program(PRESETS["small"], **kw)
    seen = set()
    for i, t in enumerate(p.tasks):
        s, (ins, outs) = spec(t.opcode), p.operands(i)
        n = s.shared(t.params, ins, outs)
        if s.name == "KV_QUANT":
            assert n == 0
        elif s.name == "RMS_LINEAR_AMAX":
            assert n == ins[2].shape[1] + CONSUMER_THREADS // 32 * t.params["nrows"]
        elif s.name == "SAMPLE":
            tiles = ins[1].shape[0]
            assert n == max(8 * CONSUMER_THREADS, -(-tiles // 4) * 4 + 4 + 2 * 512 + tiles)
        seen.add(s.name)
    assert seen & {"KV_QUANT", "RMS_LINEAR_AMAX", "SAMPLE"}
    assert xs_need(p) is not None


def test_lora_states_its_need():
    """LORA_A: its rows of A, then v; the consumers: their GEMV, or the partial sums, u and B's rows staged
    after it (lora.py: add_shared), whichever is more; the producers keep nothing in xs"""
    from megavm.instructions import spec
    from megavm.instructions.lora import add_shared
    warps = CONSUMER_THREADS // 32
    for lora_a_tasks in (True, False):
        p = _program(PRESETS["small"], lora_adapters=2, lora_rank=8, lora_targets=("q", "v", "gate", "down"),
                     lora_a_tasks=lora_a_tasks)
        seen = set()
        for i, t in enumerate(p.tasks):
            s, (ins, outs) = spec(t.opcode), p.operands(i)
            n = s.shared(t.params, ins, outs)
            if s.name == "LORA_A":
                a = ins[1]
                assert n == -(-t.params["nrows"] * a.shape[2] * a.dtype.itemsize // 4) + a.shape[2]
            elif s.name in ("RMS_LINEAR_ROPE", "RMS_LINEAR_KV", "RMS_GLU"):
                b = ins[[x.name for x in s.inputs].index("lora_b")]
                k = ins[2].shape[1]
                gemv = k + warps * t.params["nrows"]
                assert n == (gemv if b is None else max(gemv, add_shared(b, t.params["nrows"], 2 if s.name == "RMS_GLU" else 1)))
            seen.add(s.name)
        assert ("LORA_A" in seen) == lora_a_tasks
        assert xs_need(p) is not None
    b = Buffer("b", BufferKind.WEIGHT, DType.BF16, (3, 64, 8))
    # 256 threads over C = 8 columns: 32 chunks of partial sums, u, then 64 rows x 8 bf16 staged
    assert add_shared(b, 64, 1) == 32 * 8 + 8 + 64 * 8 * 2 // 4


def test_pack_records_the_need_and_program_defines_builds_it(monkeypatch):
    from megavm.vm.megakernel import program_defines
    p = _program(PRESETS["small"])
    packed = pack(p, assign(p, 8))
    assert packed.meta["xs_floats"] == xs_need(p) == 3840
    assert program_defines(packed, None) == {"MEGAVM_MAX_K": 4280, "MVM_STAGES": 13}
    # a caller's knob that sizes the build keeps the default sizes; other knobs come along
    assert program_defines(packed, {"MEGAVM_MAX_K": MAX_K}) == {"MEGAVM_MAX_K": MAX_K}
    assert program_defines(packed, {"MVM_STAGES": 8}) == {"MVM_STAGES": 8}
    assert program_defines(packed, {"MVM_E2M1_MMA": 1}) == {"MVM_E2M1_MMA": 1}     # its fragments sit above x
    assert program_defines(packed, {"MVM_ATTN_MMA": 0}) == {"MEGAVM_MAX_K": 4280, "MVM_STAGES": 13, "MVM_ATTN_MMA": 0}
    for flags in ("-DMVM_STAGES=9", "-lineinfo -D MVM_STAGES=9", "-DMVM_CONSUMER_WARPS"):
        monkeypatch.setenv("MEGAVM_NVCC_FLAGS", flags)
        assert program_defines(packed, None) is None, flags


def test_describe_names_the_build():
    assert describe({}) == "shared memory: 16384 floats of xs and 10 ring stages (the defaults)"
    assert describe({"MEGAVM_MAX_K": 12480, "MVM_STAGES": 11, "MVM_ATTN_MMA": 0}) == \
        "shared memory: 12480 floats of xs and 11 ring stages (a tier sized to the program)"
    assert describe({"MVM_STAGES": 8}).endswith("8 ring stages (as set)")


def test_a_caller_xs_below_the_programs_need_is_refused(monkeypatch):
    from megavm.core.errors import UserError
    from megavm.vm.megakernel import program_defines
    p = _program(PRESETS["small"])
    packed = pack(p, assign(p, 8))
    with pytest.raises(UserError, match=r"MEGAVM_MAX_K=3836: the program's tasks use 3840 floats of xs"):
        program_defines(packed, {"MEGAVM_MAX_K": 3836})
    assert program_defines(packed, {"MEGAVM_MAX_K": 3840}) == {"MEGAVM_MAX_K": 3840}
    with pytest.raises(UserError, match="multiple of 4"):
        program_defines(packed, {"MEGAVM_MAX_K": 3842})
    monkeypatch.setenv("MEGAVM_NVCC_FLAGS", "-DMEGAVM_MAX_K=2048")
    with pytest.raises(UserError, match="MEGAVM_MAX_K=2048"):
        program_defines(packed, None)
    monkeypatch.delenv("MEGAVM_NVCC_FLAGS")
    from megavm.vm.sizing import check_xs           # a need not stated (an opcode with no hook): the whole xs
    with pytest.raises(UserError, match=r"the whole xs \(16384 floats"):
        check_xs(None, {"MEGAVM_MAX_K": 12288})


def test_nvfp4_tensor_core_tiles_hold_their_room():
    """tc_shared (instructions/gemv_f8.cuh: e2m1_f8_takes): 3 K + the consumer warps' factors + PART_FLOATS for
    tiles of a 2-D E2M1 weight
    of K = 2048 or 4096 and at least MVM_E2M1_F8 rows, nothing for the rest; llama-7b-32k's gate/up and
    LM head tiles state it (the default build holds it), llama-1b's still fit its 12-stage tier"""
    from megavm.core.limits import E2M1_F8
    from megavm.instructions import spec
    from megavm.instructions.tiles import tc_shared
    assert E2M1_F8 == 96

    def w(dt, *shape):
        return Buffer("w", BufferKind.WEIGHT, dt, shape)
    warps = CONSUMER_THREADS // 32
    assert tc_shared(w(DType.E2M1, 11008, 4096), 4096, 96) == 3 * 4096 + warps + PART_FLOATS
    assert tc_shared(w(DType.E2M1, 2048, 2048), 2048, 256) == 3 * 2048 + warps + PART_FLOATS
    assert tc_shared(w(DType.E2M1, 11008, 4096), 4096, 95) == 0            # a short tile keeps the loop
    assert tc_shared(w(DType.E2M1, 4096, 8192), 8192, 128) == 0            # K outside 2048 / 4096
    assert tc_shared(w(DType.E2M1, 8, 1024, 4096), 4096, 128) == 0         # an expert stack
    assert tc_shared(w(DType.BF16, 11008, 4096), 4096, 128) == 0
    assert tc_shared(None, 4096, 128) == 0
    p = _program(PRESETS["llama-7b-32k"], weights="nvfp4", capacity=128, n_sms=132)
    taken = set()
    for i, t in enumerate(p.tasks):
        s, (ins, outs) = spec(t.opcode), p.operands(i)
        if s.name in ("RMS_GLU", "RMS_LINEAR_ARGMAX") and t.params["nrows"] >= E2M1_F8:
            assert s.shared(t.params, ins, outs) == 3 * 4096 + warps + PART_FLOATS, (s.name, t.params)
            taken.add(s.name)
    assert taken == {"RMS_GLU", "RMS_LINEAR_ARGMAX"}
    assert ring_defines(xs_need(p)) == {}
    p1 = _program(PRESETS["llama-1b"], weights="nvfp4", capacity=128, n_sms=132)
    assert ring_defines(xs_need(p1)) == {"MEGAVM_MAX_K": 8380, "MVM_STAGES": 12}


def test_int4_integer_tensor_core_tiles_hold_their_room():
    """MVM_U4_IMMA = 32 by default: tc_shared (gemv_imma.cuh: u4_imma_form) holds 2 K + K / 64 + the group
    tables' ring (MVM_U4_TAB_AHEAD + 1 slots of K / 8 floats for the eight warps) + PART_FLOATS for tiles of a
    2-D U4 weight of K = 2048 or 4096 and at least 32 rows; llama-7b-32k's q/k/v, o, gate/up and LM head tiles
    state it (the default build holds it), llama-1b's (q, gate/up and LM head: its k, v and o tiles are shorter)
    still fit its 12-stage tier"""
    from megavm.core.limits import U4_IMMA, U4_TAB_AHEAD
    from megavm.instructions import spec
    from megavm.instructions.tiles import tc_shared
    assert U4_IMMA == 32 and U4_TAB_AHEAD == 3

    def w(*shape):
        return Buffer("w", BufferKind.WEIGHT, DType.U4, shape)
    assert tc_shared(w(11008, 4096), 4096, 32) == 2 * 4096 + 64 + 4 * 4096 // 8 + PART_FLOATS
    assert tc_shared(w(2048, 2048), 2048, 256) == 2 * 2048 + 32 + 4 * 2048 // 8 + PART_FLOATS
    assert tc_shared(w(11008, 4096), 4096, 31) == 0                      # a short tile keeps gemv_xreg
    assert tc_shared(w(8, 1024, 4096), 4096, 128) == 0                   # an expert stack
    assert tc_shared(w(4096, 14336), 14336, 128) == 0                    # K outside 2048 / 4096
    for model, k, names in (("llama-7b-32k", 4096, {"RMS_GLU", "RMS_LINEAR_ARGMAX", "RMS_LINEAR_ROPE", "RMS_LINEAR_KV",
                                                     "LINEAR_RESIDUAL"}),
                            ("llama-1b", 2048, {"RMS_GLU", "RMS_LINEAR_ARGMAX", "RMS_LINEAR_ROPE"})):
        p = _program(PRESETS[model], weights="int4", capacity=128, n_sms=132)
        taken = set()
        for i, t in enumerate(p.tasks):
            s, (ins, outs) = spec(t.opcode), p.operands(i)
            ws = [b for b in ins if b is not None and b.kind == BufferKind.WEIGHT and len(b.shape) == 2
                  and b.shape[1] == k]
            if ws and t.params.get("nrows", 0) >= U4_IMMA:
                assert s.shared(t.params, ins, outs) >= 2 * k + k // 64 + k // 2 + PART_FLOATS, (s.name, t.params)
                taken.add(s.name)
        assert taken == names, model
        assert ring_defines(xs_need(p)) == ({} if model == "llama-7b-32k" else {"MEGAVM_MAX_K": 8380, "MVM_STAGES": 12})


@pytest.mark.parametrize("case,weights", [("llama-k2048", "int4"), ("llama-k2048", "nvfp4"),
                                          ("llama-k2048-f8192", "int4")])
def test_tc_case_tiles_take_the_tensor_core_paths(case, weights):
    """tests/hf_families.TC_CASES over their queues (the GPU tests' transformers checks of the 4-bit tensor-core
    GEMVs): every projection and LM head tile holds tc_shared's room, so the default build's int4 tiles all take
    the integer tensor cores and NVFP4's K = 4096 ones e4m3. llama-k2048 (TC_SMS): K = 2048 and 4096;
    llama-k2048-f8192 (TC_LONG_SMS): K = 2048 and its down projection's 8192, with B in x's place."""
    from megavm.instructions import spec
    from megavm.instructions.tiles import tc_shared
    from tests.hf_families import BASE, TC_CASES, TC_LONG_SMS, TC_SMS
    kind, f = TC_CASES[case]
    assert kind == "llama"
    cfg = ModelConfig(dim=f["hidden_size"], n_layers=BASE["num_hidden_layers"], n_heads=f["num_attention_heads"],
                      n_kv_heads=f["num_key_value_heads"], head_dim=f["head_dim"], ffn_dim=f["intermediate_size"],
                      vocab=f["vocab_size"])
    p = _program(cfg, weights=weights, n_sms=TC_SMS if case == "llama-k2048" else TC_LONG_SMS)
    ks = set()
    for i, t in enumerate(p.tasks):
        ws = [b for b in p.operands(i)[0] if b is not None and b.kind == BufferKind.WEIGHT and len(b.shape) == 2]
        if ws and "nrows" in t.params:
            k, consumes_x = ws[0].shape[1], spec(t.opcode).name == "LINEAR_RESIDUAL"
            assert tc_shared(ws[0], k, t.params["nrows"], consumes_x) > 0, (ws[0].name, k, t.params["nrows"])
            ks.add(k)
    assert ks == ({2048, 4096} if case == "llama-k2048" else {2048, 8192})


def test_int4_in_place_tiles_hold_their_room(monkeypatch):
    """MVM_U4_IMMA_LONG = N (32 by default): a U4 tile of N to 64 rows of K a multiple of 2048 past 4096, of an
    opcode done with x after its GEMV (LINEAR_RESIDUAL), holds K + K / 64 floats (B in x's place, gemv_imma.cuh:
    u4_imma_form 2); other tiles and opcodes nothing more. llama-7b-32k's down tiles (32 rows of K = 14336) take
    it; llama-1b's (16 rows of K = 8192) do not, and at N = 1 it keeps its 12-stage tier."""
    from megavm.core.limits import U4_IMMA_LONG
    from megavm.instructions import spec, tiles
    assert U4_IMMA_LONG == 32

    def w(*shape):
        return Buffer("w", BufferKind.WEIGHT, DType.U4, shape)
    assert tiles.tc_shared(w(4096, 14336), 14336, 32, consumes_x=True) == 14336 + 224
    assert tiles.tc_shared(w(2048, 8192), 8192, 16, consumes_x=True) == 0        # shorter than 32 rows
    p = _program(PRESETS["llama-7b-32k"], weights="int4", capacity=128, n_sms=132)
    downs = [(i, t) for i, t in enumerate(p.tasks) if spec(t.opcode).name == "LINEAR_RESIDUAL" and
             p.operands(i)[0][1].shape[1] == 14336]
    assert downs and all(32 <= t.params["nrows"] <= 64 for _, t in downs)
    assert all(spec(t.opcode).shared(t.params, *p.operands(i)) >= 14336 + 224 for i, t in downs)
    monkeypatch.setattr(tiles, "U4_IMMA_LONG", 1)
    assert tiles.tc_shared(w(2048, 8192), 8192, 16, consumes_x=True) == 8192 + 128
    assert tiles.tc_shared(w(2048, 8192), 8192, 16) == 0                          # x still needed
    assert tiles.tc_shared(w(2048, 8192), 8192, 65, consumes_x=True) == 0         # sums past acc
    assert tiles.tc_shared(w(2048, 11008), 11008, 16, consumes_x=True) == 0       # not whole stages
    assert tiles.tc_shared(Buffer("w", BufferKind.WEIGHT, DType.E2M1, (2048, 8192)), 8192, 16, consumes_x=True) == 0
    p = _program(PRESETS["llama-1b"], weights="int4", capacity=128, n_sms=132)
    took = [t for i, t in enumerate(p.tasks) if spec(t.opcode).name == "LINEAR_RESIDUAL" and
            p.operands(i)[0][1].shape[1] == 8192]
    assert took and all(t.params["nrows"] <= 64 for t in took)
    assert ring_defines(xs_need(p)) == {"MEGAVM_MAX_K": 8380, "MVM_STAGES": 12}
