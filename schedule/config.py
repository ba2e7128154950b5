"""The schedule config: how one decode step is tiled, fused and spread over SMs. Defaults are picked
from the model shape and the SM count (resolve); every field left at 0 is such a default."""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace

from megavm.core.errors import ConfigError
from megavm.core.limits import CONSUMER_THREADS, MAX_KV_BLOCK, MAX_TILE_ROWS
from megavm.core.types import DType
from megavm.instructions.attention import scores_fit
from megavm.schedule.assign import DEFAULT_STRATEGY
from megavm.schedule.models import ModelConfig
from megavm.schedule.rope import BELOW_ORIGINAL, original_context, rope_type


# ScheduleConfig.weights -> the projections' dtype; the quantized forms
WEIGHT_FORMATS = {"": None, "fp8": DType.F8E4M3, "nvfp4": DType.E2M1, "mxfp4": DType.E2M1, "int4": DType.U4,
                  "fp8-block": DType.F8E4M3}
QUANTIZED = tuple(f for f in WEIGHT_FORMATS if f)
# ScheduleConfig.kv_cache -> the caches' dtype; a quantized cache is appended by amax -> quantize tasks
KV_FORMATS = {"": None, "fp8": DType.F8E4M3, "nvfp4": DType.E2M1}


@dataclass(frozen=True)
class ScheduleConfig:
    dtype: str = "bf16"          # weights and KV cache; activations are always f32
    weights: str = ""            # the projections' and LM head's storage: "" as dtype; "fp8": e4m3 codes, an f32
    #                              scale per output row (buffers <name>.scale), dequantized in registers; "nvfp4":
    #                              e2m1 codes, an e4m3 scale per 16 (<name>.block_scale) and the tensor's f32 scale
    #                              per row (<name>.scale); "mxfp4": e2m1 codes stored the same way, each block of 32's
    #                              e8m0 exponent in <name>.block_scale (no row scales); "int4": AWQ's 4-bit codes, each group of
    #                              128 as (code - zero) * scale, f16 pairs in <name>.block_scale (no row scales);
    #                              "fp8-block": e4m3 codes, an f32 scale per 128 x 128 block in <name>.block_scale
    #                              (the Hugging Face "fp8" format's weight_scale_inv; no row scales)
    kv_cache: str = ""           # the KV cache's storage: "" as dtype; "fp8": e4m3 codes and an f32 scale per
    #                              (KV head, position), the new row's amax / 448 (RMS_LINEAR_AMAX -> KV_QUANT);
    #                              "nvfp4": e2m1 codes, an e4m3 scale per 16 elements (<which>_bscale) and an
    #                              f32 scale per (KV head, position), the new row's amax / (448 x 6)
    capacity: int = 512          # KV cache positions
    n_sms: int = 132             # SM queues; tile sizes are picked for about one tile per SM
    strategy: str = DEFAULT_STRATEGY  # SM assignment (schedule/assign.py: STRATEGIES)
    cost: tuple = ()             # the balanced assignment's cost model, fitted per opcode (flywheel/costfit.py);
    #                              (): the hand-written one
    qkv_rows: int = 0            # q/k/v tile height (must divide head_dim); 0: tiles per KV head below
    q_tiles: int = 0             # q tiles per KV head (its group of query heads); 0: from qkv_rows, else n_sms
    kv_tiles: int = 0            # k tiles, and v tiles, per KV head; 0: from qkv_rows, else n_sms
    o_rows: int = 0
    ffn_rows: int = 0
    down_rows: int = 0
    lm_rows: int = 0
    kv_block: int = 0            # keys per attention partial; capacity or more: one partial per KV head
    combine_q_heads: int = 0     # query heads an ATTN_COMBINE task merges (a KV head's group in tasks of that
    #                              many heads); 0: picked from the shape (combine_q_heads())
    embed_cols: int = 0
    router_rows: int = 0         # router logit tile height (mixture of experts)
    expert_rows: int = 0         # EXPERT_GLU tile height: rows of one chosen expert's gate and up
    expert_down_rows: int = 0    # EXPERT_DOWN tile height: output rows, each summed over the chosen experts
    # lowering ablations (each computes bit-identical results; docs/performance.md measures them)
    head_counters: bool = True   # q/k/v -> attention waits per KV head; False: one counter per layer
    q_counter: bool = False      # the q tiles (or q finishers) signal a counter of their own, read only by the
    #                              partials' polled wait, so their signals are relaxed (vm/pack.py); False: q, k
    #                              and v share one, which the loader's history streams acquire (True timed within
    #                              the noise on an H100, session 45)
    fuse_combine: bool = False   # the o-projection combines the attention partials itself (measured slower)
    attn_direct: bool = True     # one KV block (kv_block >= capacity, the default while ONE_BLOCK_WORK allows):
    #                              its partial writes the attention output, no combine task (schedule/lower.py);
    #                              False: a combine normalises it, and kv_block's default is blocks of about one
    #                              partial per SM
    inline_combine: bool = False  # a head's combine runs inline, on the SM of its last partial (docs/ir.md;
    #                               the megakernel needs a build with MVM_INLINE_TASKS=1; measured slower)
    fuse_norm: bool = True       # RMSNorm in each projection's prologue; False: RMSNORM tasks
    fuse_rope: bool = True       # RoPE + KV append in the q/k/v epilogues; False: ROPE / KV_APPEND tasks
    fuse_residual: bool = True   # residual add in the o/down epilogues; False: LINEAR tiles + ADD
    fuse_argmax: bool = True     # LM-head tiles emit (max, index) partials; False: ARGMAX over the logits
    tagged: bool = True          # activations handed over as (value, tag) words, their waits polled (schedule/
    #                              tagging.py); False: every hand-off a counter wait and a plain load
    tag_expert_h: bool = True    # with tagged: the expert GLU tiles' h too, so EXPERT_DOWN polls it instead of
    #                              waiting on their counter; False: that one hand-off a counter wait
    sample: bool = False         # the next token drawn by SAMPLE (runtime inputs sampling = (temperature, top_k,
    #                              top_p) and seed) instead of ARGMAX's greedy choice
    fit_chain: bool = False      # q/k/v tile counts left at 0 picked so that a layer's q/k/v stage and its
    #                              partials take a queue each (schedule/fit.py); within noise on the H100
    #                              (docs/performance.md, session 42)
    split_head_norm: bool = True  # per-head q/k norms (Qwen3): q/k tiles of any height, and per KV head ROPE /
    #                               KV_APPEND tasks norm, rotate and append; False: whole-head tiles norm themselves
    # LoRA adapters (schedule/lora_layout.py): room for ids 1..lora_adapters of rank up to lora_rank on
    # lora_targets (some of q, k, v, o, gate, up, down); 0 adapters: none
    lora_adapters: int = 0
    lora_rank: int = 0
    lora_targets: tuple[str, ...] = ()
    lora_a_tasks: bool = True    # A v by a few LORA_A tasks a group once v is whole; False: the tasks writing v
    #                              each add a partial product (docs/performance.md measures both)
    lora_a_rows: int = 0         # rows of A a LORA_A task takes; 0: about 48 KiB of A a task

    def to_dict(self) -> dict:
        return asdict(self)


def _rows(n: int, n_sms: int, cap: int = MAX_TILE_ROWS) -> int:
    """Tile height for about one tile per SM: ceil(n / n_sms) rounded up to even, at most cap."""
    r = min(cap, max(2, -(-n // n_sms)))
    r += r % 2
    return min(r, cap)


def _qkv_tiles(cfg: ModelConfig, n_sms: int) -> tuple[int, int]:
    """(q tiles, k tiles = v tiles) per KV head: about one q/k/v tile per SM, the tallest tile as low
    as the split allows. Tiles never straddle a KV head, so each head's attention waits on its own."""
    gh, hd = cfg.group * cfg.head_dim, cfg.head_dim
    q_min, kv_min = -(-gh // MAX_TILE_ROWS), -(-hd // MAX_TILE_ROWS)
    total = max(q_min + 2 * kv_min, n_sms // cfg.n_kv_heads)
    best = None
    for kv in range(kv_min, min(hd // 2, (total - q_min) // 2) + 1):
        q = min(total - 2 * kv, gh // 2)
        height = max(2 * -(-(gh // 2) // q), 2 * -(-(hd // 2) // kv))
        if best is None or height < best[0]:
            best = (height, q, kv)
    return best[1], best[2]


# The q tile height by default when ROPE tasks finish Qwen3's q rows (split_head_norm): measured on an H100
# (30b9e69, kernel_time/2026-11-27-30b9e69-*), q tiles of 64 rows against the 32-42 of one tile per SM:
# qwen3-1.7b 1.616-1.626 ms against 1.651, qwen3-30b-a3b 4.018-4.026 against 4.205-4.230.
SPLIT_Q_ROWS = 64

# Otherwise the q tiles by default are this share of the one-tile-per-SM count (_qkv_tiles), the k and v
# tiles unchanged, while a q tile stays within Q_TILE_WEIGHTS weights. Measured on an H100
# (kernel_time/2026-11-27-af8bd6c-q-tile-sweep-* and -3054280-q-tile-default-*, two passes each): fewer,
# taller q tiles win on llama-1b (6 a KV head 1.021-1.023 ms against 1.042-1.043 at 10), small (14:
# 0.268-0.271 against 0.296-0.300 at 23), gemma-2b (64: 2.065-2.092 against 2.107-2.108 at 106) and
# qwen2.5-1.5b (30: 1.627-1.631 against 1.668-1.679 at 50), but lose where K = 4096 makes them 700 KiB:
# llama-7b-32k 5.328 at 6 against 5.216 at 10. With the rings sized to the program (vm/sizing.py: 12
# stages on llama-1b) a q tile of 11 stages filled its ring: 64K weights (128 KiB in bf16, 8 stages) made
# llama-1b's 8 a KV head, 0.921-0.927 ms against 0.931-0.934 at 6 and 0.948-0.951 at 10, and at ctx 4096
# 1.085-1.086 against 1.091-1.097 (kernel_time/2026-11-27-075770b-q-tiles-*; no other preset moves).
Q_TILE_SHARE = 0.6
Q_TILE_WEIGHTS = 64 * 1024

# One KV block a head by default (kv_block = capacity; its partial writes the attention output, no combine:
# attn_direct) while a partial's work, group x head_dim x capacity, is at most ONE_BLOCK_WORK, and the cache
# rows it streams through its SM's ring, head_dim x capacity keys' elements of K and of V, at most
# ONE_BLOCK_ROWS. Measured on an H100 (kernel_time/2026-11-27-*-one-block-*, two passes each) against the
# blocks of at most one partial per SM (work; rows):
#   won: llama-1b 0.980-0.984 ms against 1.026-1.029 at capacity 288 (74K; 18K) and 1.032-1.034 against
#   1.082-1.091 at 672 (172K; 43K); small 0.244-0.251 against 0.264-0.272 at 288 (74K; 18K), 0.300-0.306
#   against 0.316-0.318 at 1184 (303K; 76K); qwen2.5-1.5b 1.592-1.597 against 1.619-1.636 (221K; 37K);
#   llama-7b-32k 5.133-5.160 against 5.200-5.212 (147K; 37K); qwen3-30b-a3b 3.922-3.963 against 3.985-4.011
#   (295K; 37K);
#   neutral: qwen3-1.7b at 288 (74K; 37K), llama-1b at 1184 (303K; 76K);
#   lost: gemma-2b, one KV head of 8 query heads of 256, 2.119-2.142 against 2.064-2.091 (590K; 74K);
#   (session 43, kernel_time/2026-11-27-73c0c9c-one-block-bound-*) llama-1b at 1440 1.134-1.154 against
#   1.102-1.121 (369K; 92K); qwen2.5-1.5b at 544 1.690-1.705 against 1.647-1.662 (418K; 70K); llama-7b-32k
#   at 672 5.322-5.346 against 5.298-5.300 (344K; 86K); qwen3-1.7b at 1184 1.975-1.990 against 1.733-1.758
#   (303K; 152K: its partials' stage 20.4 us, 606 KB of cache each through one SM).
ONE_BLOCK_WORK = 5 << 16
ONE_BLOCK_ROWS = 5 << 14


def one_block(capacity: int) -> int:
    """kv_block of one block a KV head: the capacity in whole 16-key tiles."""
    return 16 * math.ceil(capacity / 16)


def split_head_norm(cfg: ModelConfig, sc: ScheduleConfig) -> bool:
    """Whether a model's per-head q/k norms are applied by finishing tasks (ROPE, KV_APPEND) after q/k
    tiles of any height, rather than by whole-head tiles: always when the RoPE is unfused, by default
    otherwise, but not when LoRA adapts q or k (the plain tiles take no low-rank term)."""
    if not cfg.qk_norm or sc.kv_cache:     # a quantized cache's tiles finish their rows: whole heads
        return False
    if not sc.fuse_rope:
        return True
    return sc.split_head_norm and not (sc.lora_adapters and {"q", "k"} & set(sc.lora_targets))


def resolve(cfg: ModelConfig, sc: ScheduleConfig) -> ScheduleConfig:
    """Fill the sizes left at 0 from the model shape and the SM count (idempotent)."""
    if sc.n_sms < 1:
        raise ConfigError(f"n_sms={sc.n_sms} must be >= 1")
    if sc.capacity < 1:
        raise ConfigError(f"capacity={sc.capacity} must be >= 1")
    if sc.weights not in WEIGHT_FORMATS:
        raise ConfigError(f"weights={sc.weights!r}: megavm stores projections as {sorted(WEIGHT_FORMATS)}")
    if sc.kv_cache not in KV_FORMATS:
        raise ConfigError(f"kv_cache={sc.kv_cache!r}: megavm stores KV caches as {sorted(KV_FORMATS)}")
    if sc.weights == "fp8-block" and 128 % cfg.head_dim:
        raise ConfigError(f"weights='fp8-block' needs head_dim dividing 128, not {cfg.head_dim}: megavm keeps query and "
                          f"key rows in RoPE pair order, which keeps each row in its 128 x 128 block only then")
    if sc.kv_cache == "nvfp4" and cfg.head_dim % 32:
        raise ConfigError(f"kv_cache='nvfp4' needs head_dim a multiple of 32, not {cfg.head_dim}: a row of codes is "
                          f"whole 16-byte pieces and whole blocks of 16")
    if sc.kv_cache and not sc.fuse_rope:
        raise ConfigError(f"kv_cache={sc.kv_cache!r} needs fuse_rope: the k and v tiles finish the rows they quantize")
    if rope_type(cfg) in BELOW_ORIGINAL and sc.capacity > (original_context(cfg) or 0):
        raise ConfigError(f"rope_type {rope_type(cfg)!r} changes with the sequence length past "
                          f"{original_context(cfg)} positions; capacity {sc.capacity} goes past it")
    n_kv, hd = cfg.n_kv_heads, cfg.head_dim
    if cfg.qk_norm and not split_head_norm(cfg, sc):   # a tile's own head norm needs whole heads
        q_tiles, kv_tiles = cfg.group, 1
    elif sc.q_tiles and sc.kv_tiles:
        q_tiles, kv_tiles = sc.q_tiles, sc.kv_tiles
    else:                                  # the counts left at 0 from qkv_rows, else from the SM count
        if sc.qkv_rows:
            if hd % sc.qkv_rows or sc.qkv_rows % 2:
                raise ConfigError(f"qkv_rows={sc.qkv_rows} must be even and divide head_dim={hd}")
            q_tiles, kv_tiles = -(-cfg.group * hd // sc.qkv_rows), -(-hd // sc.qkv_rows)
        else:
            q_tiles, kv_tiles = _qkv_tiles(cfg, sc.n_sms)
            if cfg.qk_norm:                # plain q tiles that ROPE tasks finish: fewer, taller ones
                q_tiles = max(1, min(q_tiles, cfg.group * hd // SPLIT_Q_ROWS))
            else:
                q_tiles = max(-(-cfg.group * hd // MAX_TILE_ROWS), round(q_tiles * Q_TILE_SHARE),
                              min(q_tiles, -(-cfg.group * hd * cfg.dim // Q_TILE_WEIGHTS)))
        q_tiles, kv_tiles = sc.q_tiles or q_tiles, sc.kv_tiles or kv_tiles
    qkv = sc.qkv_rows or max(2 * -(-(cfg.group * hd // 2) // q_tiles), 2 * -(-(hd // 2) // kv_tiles))
    # at most one partial per SM (n_sms // n_kv blocks per KV head): a 133rd task makes a second round
    kv_block = sc.kv_block or max(64, 16 * math.ceil(sc.capacity / max(1, sc.n_sms // n_kv) / 16))
    if not sc.kv_block:   # small enough for the partial's scores to fit in shared memory
        fit = scores_fit(cfg.group, hd, KV_FORMATS[sc.kv_cache]) // 16 * 16
        kv_block = min(kv_block, max(16, fit))
        one = one_block(sc.capacity)              # or one block a KV head (ONE_BLOCK_WORK, ONE_BLOCK_ROWS)
        if (sc.attn_direct and cfg.group * hd * one <= ONE_BLOCK_WORK and hd * one <= ONE_BLOCK_ROWS
                and one <= min(fit, MAX_KV_BLOCK)):
            kv_block = one
    if sc.combine_q_heads < 0:
        raise ConfigError(f"combine_q_heads={sc.combine_q_heads} must be >= 0 (0: picked from the shape)")
    return replace(sc, qkv_rows=qkv, q_tiles=q_tiles, kv_tiles=kv_tiles,
                   combine_q_heads=min(cfg.group, sc.combine_q_heads or combine_q_heads(cfg, sc)),
                   o_rows=sc.o_rows or _rows(cfg.dim, sc.n_sms),
                   ffn_rows=sc.ffn_rows or _rows(cfg.ffn_dim, sc.n_sms, cap=MAX_TILE_ROWS // 2),
                   down_rows=sc.down_rows or _rows(cfg.dim, sc.n_sms),
                   lm_rows=sc.lm_rows or _rows(cfg.vocab, sc.n_sms),
                   kv_block=min(kv_block, MAX_KV_BLOCK), embed_cols=sc.embed_cols or _embed_cols(cfg, sc),
                   **_expert_rows(cfg, sc))


def combine_q_heads(cfg: ModelConfig, sc: ScheduleConfig) -> int:
    """Query heads an ATTN_COMBINE task merges, by default: as many as give each consumer thread one output
    element (head_dim 64 and 128: 4 and 2 heads, llama-1b's and qwen3-1.7b's whole groups; head_dim 256:
    one). Measured on the H100 (docs/performance.md, session 37): gemma-2b's group of 8 in 8 tasks 2.12-2.15 ms
    against 2.28-2.29 in one, qwen2.5-1.5b's 6 in 3 or 6 tasks 1.67 against 1.75; llama-1b and qwen3-1.7b
    split further are within noise. One combine per part counter where it runs inline."""
    if sc.inline_combine:
        return cfg.group
    return max(1, min(cfg.group, CONSUMER_THREADS // cfg.head_dim))


def _embed_cols(cfg: ModelConfig, sc: ScheduleConfig) -> int:
    """Columns of x an EMBED task writes: 512, or, where LoRA adapters target q, k or v and the producers
    write the partial products (lora_a_tasks=False), about one task per SM like the down tiles, whose
    place the EMBED tasks take as the first layer's producers (4 tasks of 512 columns took 18 us a step
    for them, in sequence)."""
    if sc.lora_adapters and not sc.lora_a_tasks and {"q", "k", "v"} & set(sc.lora_targets):
        r = _rows(cfg.dim, sc.n_sms)
        return max(8, -(-r // 8) * 8)
    return max(8, min(cfg.dim, 512))


# The most router weight bytes a router tile takes: qwen3-30b-a3b (128 experts x 2048, bf16) on an H100,
# 32 rows (128 KiB, 4 tiles) 3.914 / 3.909 ms against 3.961 / 3.952 at 8 rows (16 tiles), one process;
# 64 rows (256 KiB, past an 11-stage ring) slower (docs/performance.md, session 51, has the sweep).
ROUTER_TILE_BYTES = 128 * 1024


def _expert_rows(cfg: ModelConfig, sc: ScheduleConfig) -> dict:
    """Mixture-of-experts tile heights: the router's logits over a few tiles (each pays the norm
    prologue), each as tall as ROUTER_TILE_BYTES of its weights allow, so that the tile's rows are in
    its ring before mid lands; each chosen expert's gate/up rows over about n_sms / top_k tiles, and the
    down projection's output rows over about one tile per SM."""
    if not cfg.n_experts:
        return {}
    router = min(cfg.n_experts, max(2, int(ROUTER_TILE_BYTES // (cfg.dim * DType.parse(sc.dtype).itemsize))))
    return dict(router_rows=sc.router_rows or _rows(cfg.n_experts, -(-cfg.n_experts // router)),
                expert_rows=sc.expert_rows or _rows(cfg.expert_ffn, max(1, sc.n_sms // cfg.top_k),
                                                    cap=MAX_TILE_ROWS // 2),
                expert_down_rows=sc.expert_down_rows or _rows(cfg.dim, sc.n_sms))
