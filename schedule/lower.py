"""Lowering: one decode step of a Llama-lineage model (Llama, Mistral, Qwen2, Qwen3, Gemma) -> tiled
tasks and fine-grained counters. The families differ in operands and params only: q/k/v biases and
per-head q/k norms in the q/k/v tiles' epilogue, the MLP gate's activation, the embedding's scale,
RMSNorm weights with an offset (folded into f32 weights), and a sliding attention window.

Per layer l (x_l is the residual stream entering the layer):
  q/k/v tiles   wait x_l           signal qkv[l][h]   (tiles never straddle a KV head's group)
  attn partial  wait qkv[l][h]     signal part[l][h]  (one task per (KV head, KV block))
  attn combine  wait part[l][h]    signal attn[l]   (per KV head, or per range of its query heads)
  o-proj tiles  wait attn[l]       signal mid[l]      (residual add in the epilogue)
With fuse_combine, the o-proj tiles wait for every partial (one part[l] counter) and combine on load.
With one KV block (kv_block >= capacity, attn_direct), each head's partial writes its normalised output
into attn[l] itself and signals it: no combine.
  gate/up tiles wait mid[l]        signal ffn[l]
  down tiles    wait ffn[l]        signal x_{l+1}     (residual add in the epilogue)
then LM-head tiles (fused final norm, (max, index) partials) and ARGMAX.

The fusion ablations lower the same step with unfused opcodes, each a task of its own behind one more
counter: fuse_norm=False normalises with RMSNORM tasks (the projections take x as normed);
fuse_rope=False has q/k/v tiles write plain vectors that ROPE and KV_APPEND tasks finish (bias, head
norm), rotate and append, per KV head; fuse_residual=False has the o/down tiles write plain vectors (LINEAR) that an ADD task
adds to the stream; fuse_argmax=False has plain LM-head tiles and one ARGMAX over every logit.

Per-head q/k norms (Qwen3) need a head's every row before any is normed. By default (split_head_norm)
the q and k tiles are plain projections of any height, like the unfused form's, and per KV head ROPE
tasks (for its query heads) and a KV_APPEND task (its key) norm, rotate and append them, while the
value tiles append as usual; without it, each q/k tile is a whole head (16 tiles for Qwen3-1.7B's 16
query heads, each reading 512 KiB) and norms itself.
"""
from __future__ import annotations

import math
from collections import Counter as Count

from megavm.core.errors import ConfigError
from megavm.core.limits import MAX_TILE_ROWS
from megavm.core.types import U4_GROUP, DType, block_scale_name, scale_name
from megavm.core.types import BufferKind as K
from megavm.instructions import Op
from megavm.instructions.activations import CODE as ACT_CODE
from megavm.schedule.builder import TaskBuilder, even_split, row_tiles
from megavm.schedule.config import (
    KV_FORMATS,
    WEIGHT_FORMATS,
    ScheduleConfig,
    resolve,
    split_head_norm,
)
from megavm.schedule.ir import Program, Wait
from megavm.schedule.lora_layout import (
    ID,
    LoraLayout,
    consume,
    lora_a_stage,
    lora_operands,
    lora_wait,
    produce,
)
from megavm.schedule.lower_moe import experts_stage
from megavm.schedule.models import ModelConfig
from megavm.schedule.rope import rope
from megavm.schedule.tagging import tag_handoffs


def lower(cfg: ModelConfig, sc: ScheduleConfig | None = None) -> Program:
    lc = resolve(cfg, sc or ScheduleConfig())
    wdt = DType.parse(lc.dtype)
    if wdt not in (DType.F32, DType.BF16):
        raise ConfigError(f"dtype={lc.dtype!r} must be f32 or bf16")
    if lc.inline_combine and (lc.fuse_combine or not lc.head_counters):
        raise ConfigError("inline_combine needs a combine task per KV head, each on its own part counter: not "
                          "fuse_combine (the o tiles combine), not head_counters=False (one counter a layer)")
    if lc.inline_combine and lc.combine_q_heads < cfg.group:
        raise ConfigError(f"inline_combine runs one combine per part counter: combine_q_heads={lc.combine_q_heads} "
                          f"splits a group of {cfg.group}")
    if lc.fuse_combine and not lc.fuse_residual:
        raise ConfigError("fuse_combine needs fuse_residual: LINEAR takes a vector, not attention partials")
    d, hd, H, KVH, G, F, V = cfg.dim, cfg.head_dim, cfg.n_heads, cfg.n_kv_heads, cfg.group, cfg.ffn_dim, cfg.vocab
    cap, bs = lc.capacity, lc.kv_block
    nblk = math.ceil(cap / bs)
    # one block a KV head: its partial normalises and writes the attention output itself, no combine (not
    # where the combines write LoRA's partial products for the o-projection, or the o tiles combine)
    lora = LoraLayout.of(cfg, lc)
    direct = (lc.attn_direct and nblk == 1 and not lc.fuse_combine and not lc.inline_combine
              and not (lora and lora.produce(0, "o")[0]))
    split = split_head_norm(cfg, lc)         # q/k tiles of any height, finished per KV head
    if not (1 <= lc.q_tiles <= G * hd // 2 and 1 <= lc.kv_tiles <= hd // 2):
        raise ConfigError(f"q_tiles={lc.q_tiles} and kv_tiles={lc.kv_tiles} must be in [1, {G * hd // 2}] and "
                         f"[1, {hd // 2}] (tiles of at least one RoPE pair)")
    prog = Program(meta={"model": cfg.to_dict(), "schedule": lc.to_dict(),
                         "inputs": ["token", "pos"] + (["sampling", "seed"] if lc.sample else []),
                         "outputs": ["logits", "next_token"]})
    b = TaskBuilder(prog)
    P = prog.add_buffer
    # weights
    gdt = DType.F32 if cfg.norm_offset else wdt         # RMSNorm weights, with the family's offset folded in
    pdt = WEIGHT_FORMATS[lc.weights] or wdt            # the projections' and LM head's storage

    def PW(name: str, shape) -> None:
        """A projection's weight (streamed by the GEMV), with its row scales when stored in e4m3 or
        e2m1, its block scales in e2m1 (mxfp4: e8m0 exponents, no row scales) and fp8-block, its group
        table in int4."""
        P(name, K.WEIGHT, pdt, shape)
        if lc.weights == "mxfp4":
            P(block_scale_name(name), K.WEIGHT, DType.E8M0, (*shape[:-1], shape[-1] // 32))
            return
        if lc.weights == "fp8-block":
            P(block_scale_name(name), K.WEIGHT, DType.F32, (*shape[:-2], -(-shape[-2] // 128), -(-shape[-1] // 128)))
            return
        if pdt in (DType.F8E4M3, DType.E2M1):
            P(scale_name(name), K.WEIGHT, DType.F32, shape[:-1])
        if pdt == DType.E2M1:
            P(block_scale_name(name), K.WEIGHT, DType.F8E4M3, (*shape[:-1], shape[-1] // 16))
        if pdt == DType.U4:
            P(block_scale_name(name), K.WEIGHT, DType.F16, (*shape[:-1], shape[-1] // U4_GROUP, 2))
    P("tok_emb", K.WEIGHT, wdt, (V, d))
    PW("lm_head", (V, d))
    P("norm", K.WEIGHT, gdt, (d,))
    P("rope_freqs", K.WEIGHT, DType.F32, (hd // 2,))
    for l in range(cfg.n_layers):
        for n, s in (("attn_norm", (d,)), ("ffn_norm", (d,))):
            P(f"layers.{l}.{n}", K.WEIGHT, gdt, s)
        dense = () if cfg.is_moe(l) else (("w_gate", (F, d)), ("w_up", (F, d)), ("w_down", (d, F)))
        for n, s in (("wq", (H * hd, d)), ("wk", (KVH * hd, d)), ("wv", (KVH * hd, d)), ("wo", (d, H * hd))) + dense:
            PW(f"layers.{l}.{n}", s)
        if cfg.is_moe(l):
            E, Fe, Fs = cfg.n_experts, cfg.expert_ffn, cfg.shared_ffn
            for n, s in (("router", (E, d)), ("experts_gate", (E, Fe, d)), ("experts_up", (E, Fe, d)),
                         ("experts_down", (E, d, Fe))) + (
                    (("shared_gate", (Fs, d)), ("shared_up", (Fs, d)), ("shared_down", (d, Fs))) if Fs else ()):
                (P(f"layers.{l}.{n}", K.WEIGHT, wdt, s) if n == "router" else PW(f"layers.{l}.{n}", s))
            if cfg.router_bias:
                P(f"layers.{l}.router_bias", K.WEIGHT, DType.F32, (E,))
            if cfg.is_hash(l):
                P(f"layers.{l}.hash_table", K.WEIGHT, DType.I32, (V, cfg.top_k))
        if cfg.qkv_bias:
            for n, s in (("bq", (H * hd,)), ("bk", (KVH * hd,)), ("bv", (KVH * hd,))):
                P(f"layers.{l}.{n}", K.WEIGHT, wdt, s)
        if cfg.qk_norm:
            P(f"layers.{l}.q_norm", K.WEIGHT, wdt, (hd,))
            P(f"layers.{l}.k_norm", K.WEIGHT, wdt, (hd,))
    # runtime inputs, caches, activations, outputs
    P("token", K.INPUT, DType.I32, (1,))
    P("pos", K.INPUT, DType.I32, (1,))
    if lc.sample:
        if not lc.fuse_argmax:
            raise ConfigError("sample needs fuse_argmax: SAMPLE ranks the LM-head tiles by their (max, index) partials")
        P("sampling", K.INPUT, DType.F32, (3,))
        P("seed", K.INPUT, DType.I32, (1,))
    kdt = KV_FORMATS[lc.kv_cache] or wdt               # the caches' storage
    for l in range(cfg.n_layers):
        for which in ("k", "v"):
            P(f"{which}_cache.{l}", K.KV_CACHE, kdt, (KVH, cap, hd))
            if lc.kv_cache:
                P(f"{which}_scale.{l}", K.KV_CACHE, DType.F32, (KVH, cap))
            if kdt == DType.E2M1:                       # nvfp4: an e4m3 scale per 16 elements
                P(f"{which}_bscale.{l}", K.KV_CACHE, DType.F8E4M3, (KVH, cap, hd // 16))
    # with tagged hand-offs the k/v tiles (and Qwen3's KV_APPEND finishers) also hand this step's rows to
    # the partials as tagged words, so that the partials' waits are polled (schedule/tagging.py); their
    # caches' rows are then older ones
    own_rows = lc.tagged and not lc.kv_cache and lc.fuse_rope
    for l in range(cfg.n_layers + 1):
        P(f"x.{l}", K.ACTIVATION, DType.F32, (d,))
    for l in range(cfg.n_layers):
        P(f"q.{l}", K.ACTIVATION, DType.F32, (H * hd,))
        if not direct:
            P(f"part.{l}", K.ACTIVATION, DType.F32, (KVH, nblk, G, hd + 2))
        if not lc.fuse_combine:
            P(f"attn.{l}", K.ACTIVATION, DType.F32, (H * hd,))
        P(f"mid.{l}", K.ACTIVATION, DType.F32, (d,))
        if cfg.is_moe(l):
            P(f"router_logits.{l}", K.ACTIVATION, DType.F32, (cfg.n_experts,))
            P(f"expert_ids.{l}", K.ACTIVATION, DType.I32, (cfg.top_k,))
            P(f"expert_weights.{l}", K.ACTIVATION, DType.F32, (cfg.top_k,))
            P(f"expert_h.{l}", K.ACTIVATION, DType.F32, (cfg.top_k, cfg.expert_ffn))
            if cfg.shared_ffn:
                P(f"shared_h.{l}", K.ACTIVATION, DType.F32, (cfg.shared_ffn,))
        else:
            P(f"ffn.{l}", K.ACTIVATION, DType.F32, (F,))
        if not lc.fuse_norm:
            P(f"xn.{l}", K.ACTIVATION, DType.F32, (d,))
            P(f"midn.{l}", K.ACTIVATION, DType.F32, (d,))
        for which, n in (("q", H * hd), ("k", KVH * hd), ("v", KVH * hd)):
            if not lc.fuse_rope or (split and which != "v"):             # the plain tiles' outputs
                P(f"{which}_raw.{l}", K.ACTIVATION, DType.F32, (n,))
            if lc.kv_cache and which != "q":            # the finished rows and each tile's amax, to quantize
                P(f"{which}_new.{l}", K.ACTIVATION, DType.F32, (n,))
                P(f"{which}_amax.{l}", K.ACTIVATION, DType.F32, (KVH * lc.kv_tiles,))
            if own_rows and which != "q":               # this step's rows for the partials, tagged
                P(f"{which}_row.{l}", K.ACTIVATION, DType.F32, (n,))
        if not lc.fuse_residual:
            P(f"o.{l}", K.ACTIVATION, DType.F32, (d,))
            P(f"down.{l}", K.ACTIVATION, DType.F32, (d,))
    if not lc.fuse_norm:
        P(f"xn.{cfg.n_layers}", K.ACTIVATION, DType.F32, (d,))
    lm_tiles = row_tiles(V, lc.lm_rows)
    c_tiles = row_tiles(G, lc.combine_q_heads)            # (first, count) query heads of each combine of a group
    emb_tiles, o_tiles, f_tiles, down_tiles = (row_tiles(d, lc.embed_cols), row_tiles(d, lc.o_rows),
                                               row_tiles(F, lc.ffn_rows), row_tiles(d, lc.down_rows))
    if lora and cfg.n_experts:
        raise ConfigError("LoRA adapters on a mixture-of-experts model are not supported")
    if lora:
        lora.add_buffers(P, wdt, lambda g, l: {"qkv": len(down_tiles if l else emb_tiles), "o": KVH * len(c_tiles),
                                              "gu": len(o_tiles), "down": len(f_tiles)}[g])
    if lc.fuse_argmax:
        P("best", K.ACTIVATION, DType.F32, (len(lm_tiles), 2))
    P("logits", K.OUTPUT, DType.F32, (V,))
    P("next_token", K.OUTPUT, DType.I32, (1,))

    C = prog.add_counter
    norm = int(lc.fuse_norm)

    def normed(x: str, gamma: str, wait: Wait, out: str) -> tuple[list[str], Wait]:
        """The (x, gamma) operands of a normed projection, and its wait: x itself when the norm is
        fused, else an RMSNORM task's output."""
        if lc.fuse_norm:
            return [x, gamma], wait
        c = C(f"{out}.norm")
        b.task(Op.RMSNORM, [x, gamma], [out], [wait], c, out, eps=cfg.norm_eps)
        return [out, gamma], Wait(c, 1)

    x_ready = C("x.0")
    next_a, next_u, next_g = produce(lora, 0, "qkv")
    for t, (c0, n) in enumerate(emb_tiles):
        b.task(Op.EMBED, ["tok_emb", "token", next_a, next_a and ID, next_g], ["x.0", next_u], [], x_ready,
               f"embed[{c0}]", col0=c0, ncols=n, scale=cfg.embed_scale, lora_t=t if next_a else 0)
    x_wait = Wait(x_ready, len(emb_tiles))
    eps = cfg.norm_eps
    attention_factor = rope(cfg)[1]          # the rope scaling's factor on both q and k: scores by its square
    attend = dict(block_size=bs, scale=hd ** -0.5 * attention_factor ** 2, window=cfg.sliding_window or 0)

    def epilogue(l: int, which: str) -> list[str | None]:
        """The q/k/v tile's optional bias and head-norm operands."""
        return [f"layers.{l}.b{which}" if cfg.qkv_bias else None,
                f"layers.{l}.{which}_norm" if cfg.qk_norm and which != "v" else None]
    for l in range(cfg.n_layers):
        L = f"layers.{l}."
        qkv = [C(f"L{l}.qkv.h{h}") for h in range(KVH)] if lc.head_counters else [C(f"L{l}.qkv")] * KVH
        # q's own counter (q_counter): only the partials wait on it, polled, so the q tiles' signals are relaxed;
        # k and v keep theirs, which the loader's history streams acquire before copying the rows they append
        qc = ([C(f"L{l}.q.h{h}") for h in range(KVH)] if lc.head_counters else [C(f"L{l}.q")] * KVH) \
            if lc.q_counter else qkv
        part_heads = 1 if lc.head_counters and not lc.fuse_combine else KVH    # partials per part counter
        if direct:                                  # the partials write attn and signal its counter
            attn = C(f"L{l}.attn")
            part = [attn] * KVH
        else:
            part = [C(f"L{l}.part.h{h}") for h in range(KVH)] if part_heads == 1 else [C(f"L{l}.part")] * KVH
            attn = None if lc.fuse_combine else C(f"L{l}.attn")
        mid, ffn = C(f"L{l}.mid"), C(f"L{l}.ffn")
        xn = C(f"x.{l + 1}")
        xin, x_wait = normed(f"x.{l}", L + "attn_norm", x_wait, f"xn.{l}")
        q_split = [(h, r0, n) for h in range(KVH) for r0, n in even_split(h * G * hd, G * hd, lc.q_tiles)]
        kv_split = [(h, r0, n) for h in range(KVH) for r0, n in even_split(h * hd, hd, lc.kv_tiles)]
        per_head = 1 if lc.head_counters else KVH          # heads signalling each qkv / proj counter
        # plain tiles, finished per KV head by ROPE / KV_APPEND tasks; q is plain whenever any is
        plain = ("q", "k", "v") if not lc.fuse_rope else ("q", "k") if split else ()
        fused = tuple(w for w in ("q", "k", "v") if w not in plain)
        q_count = qkv_count = 0                             # signals per KV head that attention waits for
        la_qkv = lora_a_stage(b, lora, l, "qkv", f"x.{l}", x_wait)
        if "q" in fused:
            lq, q_off = consume(lora, l, "q")
            for h, r0, n in q_split:
                b.task(Op.RMS_LINEAR_ROPE, xin + [L + "wq", "pos", "rope_freqs"] + epilogue(l, "q") + lq, [f"q.{l}"],
                       [x_wait] + lora_wait(lq, la_qkv), qc[h], f"L{l}.q[{r0}]", row0=r0, nrows=n, eps=eps,
                       norm=norm, head_dim=hd, lora_off=q_off)
            q_count += lc.q_tiles
        for which, rotate in (("k", 1), ("v", 0)):
            if which not in fused:
                continue
            lkv, kv_off = consume(lora, l, which)
            tile_ins = xin + [L + "w" + which, "pos", "rope_freqs"] + epilogue(l, which) + lkv
            if lc.kv_cache:                            # amax -> quantize: two dependent steps, no host sync
                amax = C(f"L{l}.{which}_amax")
                for t, (h, r0, n) in enumerate(kv_split):
                    b.task(Op.RMS_LINEAR_AMAX, tile_ins, [f"{which}_new.{l}", f"{which}_amax.{l}"],
                           [x_wait] + lora_wait(lkv, la_qkv), amax,
                           f"L{l}.{which}[{r0}]", row0=r0, nrows=n, eps=eps, norm=norm, head_dim=hd, rope=rotate,
                           lora_off=kv_off, tile=t)
                for h in range(KVH):
                    b.task(Op.KV_QUANT, [f"{which}_new.{l}", f"{which}_amax.{l}", "pos"],
                           [f"{which}_cache.{l}", f"{which}_scale.{l}"] + ([f"{which}_bscale.{l}"] if kdt == DType.E2M1
                                                                           else []),
                           [Wait(amax, len(kv_split))], qkv[h],
                           f"L{l}.{which}_quant.h{h}", kv_head=h)
                qkv_count += 1
            else:
                for h, r0, n in kv_split:
                    b.task(Op.RMS_LINEAR_KV, tile_ins, [f"{which}_cache.{l}"] + ([f"{which}_row.{l}"] if own_rows else []),
                           [x_wait] + lora_wait(lkv, la_qkv), qkv[h], f"L{l}.{which}[{r0}]",
                           row0=r0, nrows=n, eps=eps, norm=norm, head_dim=hd, rope=rotate, lora_off=kv_off)
                qkv_count += lc.kv_tiles
        if plain:
            # with a bias or head norm the rows are finished in shared memory: at most a tile's rows each
            q_rows = G * hd if not any(epilogue(l, "q")) else max(1, MAX_TILE_ROWS // hd) * hd
            q_finish = row_tiles(G * hd, q_rows)
            # Each finisher waits only on the tiles whose rows it reads, so that with tagged rows its wait is
            # polled (schedule/tagging.py): q tiles are cut within each ROPE's rows, and the tiles of each
            # finisher (a ROPE's rows, a KV head's k; without head counters, a projection's) share a counter.
            per = -(-lc.q_tiles // len(q_finish))
            tiles = {("q", h, f): list(even_split(h * G * hd + f0, fn, min(per, fn // 2)))
                     for h in range(KVH) for f, (f0, fn) in enumerate(q_finish)} if "q" in plain else {}
            tiles.update({(w, h, 0): [(r0, n) for hh, r0, n in kv_split if hh == h] for w in plain if w != "q"
                          for h in range(KVH)})
            counters, signals = {}, Count()

            def proj(which: str, h: int, f: int) -> int:
                name = f"L{l}.{which}proj" + (f".h{h}" + (f".{f}" if which == "q" and len(q_finish) > 1 else "")
                                             if lc.head_counters else "")
                if name not in counters:
                    counters[name] = C(name)
                return counters[name]
            for (which, h, f), rows in tiles.items():          # q, then k, then v
                for r0, n in rows:
                    signals[proj(which, h, f)] += 1
                    b.task(Op.RMS_LINEAR, xin + [L + "w" + which], [f"{which}_raw.{l}"], [x_wait], proj(which, h, f),
                           f"L{l}.{which}[{r0}]", row0=r0, nrows=n, eps=eps, norm=norm)
            kv_plain = [(w, rotate) for w, rotate in (("k", 1), ("v", 0)) if w in plain]
            for h in range(KVH):
                for f, (r0, n) in enumerate(q_finish):
                    c = proj("q", h, f)
                    b.task(Op.ROPE, [f"q_raw.{l}", "pos", "rope_freqs"] + epilogue(l, "q"), [f"q.{l}"],
                           [Wait(c, signals[c])], qc[h],
                           f"L{l}.rope.h{h}[{r0}]", row0=h * G * hd + r0, nrows=n, head_dim=hd, eps=eps)
                for which, rotate in kv_plain:
                    c = proj(which, h, 0)
                    b.task(Op.KV_APPEND, [f"{which}_raw.{l}", "pos", "rope_freqs"] + epilogue(l, which),
                           [f"{which}_cache.{l}"] + ([f"{which}_row.{l}"] if own_rows else []),
                           [Wait(c, signals[c])], qkv[h], f"L{l}.{which}_append.h{h}",
                           row0=h * hd, nrows=hd, head_dim=hd, rope=rotate, eps=eps)
            q_count += len(q_finish)                        # q is plain whenever any is
            qkv_count += len(kv_plain)
        for h in range(KVH):
            for blk in range(nblk):
                if own_rows:                            # this step's rows from the k/v tiles
                    tail = [None, None, f"k_row.{l}", f"v_row.{l}"]
                elif kdt == DType.E2M1:                 # codes, row scales and block scales
                    tail = [f"k_scale.{l}", f"v_scale.{l}", None, None, f"k_bscale.{l}", f"v_bscale.{l}"]
                else:
                    tail = [f"k_scale.{l}", f"v_scale.{l}"] if lc.kv_cache else []
                b.task(Op.ATTN_PARTIAL, [f"q.{l}", f"k_cache.{l}", f"v_cache.{l}", "pos"] + tail,
                       [f"attn.{l}" if direct else f"part.{l}"],
                       [Wait(qc[h], q_count * per_head), Wait(qkv[h], qkv_count * per_head)] if lc.q_counter
                       else [Wait(qkv[h], (q_count + qkv_count) * per_head)], part[h], f"L{l}.attn.h{h}.b{blk}",
                       kv_head=h, block=blk, **attend)
        if direct:
            o_in, o_wait = f"attn.{l}", Wait(attn, KVH)
        elif lc.fuse_combine:       # every o tile combines every head's partials on load
            o_in, o_wait = f"part.{l}", Wait(part[0], KVH * nblk)
        else:
            next_a, next_u, _ = produce(lora, l, "o")
            for h in range(KVH):
                for t, (q0, nq) in enumerate(c_tiles):
                    b.task(Op.ATTN_COMBINE, [f"part.{l}", next_a, next_a and ID], [f"attn.{l}", next_u],
                           [Wait(part[h], nblk * part_heads)], attn,
                           f"L{l}.combine.h{h}" + (f".q{q0}" if len(c_tiles) > 1 else ""), inline=lc.inline_combine,
                           kv_head=h, lora_t=h * len(c_tiles) + t if next_a else 0, q0=q0, q_heads=nq)
            o_in, o_wait = f"attn.{l}", Wait(attn, KVH * len(c_tiles))
        la_o = lora_a_stage(b, lora, l, "o", o_in, o_wait)
        mid_wait = residual_stage(b, lc, [o_in, L + "wo", f"x.{l}"], f"o.{l}", f"mid.{l}", o_wait, mid,
                                  o_tiles, f"L{l}.o", lora_operands(lora, l, "o", l, "gu"), la_o)
        hin, mid_wait = normed(f"mid.{l}", L + "ffn_norm", mid_wait, f"midn.{l}")
        if cfg.is_moe(l):
            x_wait = experts_stage(b, cfg, lc, l, hin, mid_wait, xn)
            continue
        ins, outs, lp = lora_operands(lora, l, "gate", l, "down")
        la_gu = lora_a_stage(b, lora, l, "gu", f"mid.{l}", mid_wait)
        for t, (r0, n) in enumerate(f_tiles):
            b.task(Op.RMS_GLU, hin + [L + "w_gate", L + "w_up"] + ins, [f"ffn.{l}"] + outs,
                   [mid_wait] + la_gu, ffn, f"L{l}.gate_up[{r0}]", row0=r0, nrows=n, eps=eps, norm=norm,
                   act=ACT_CODE[cfg.mlp_act], lora_t=t if ins[3] else 0, **lp)
        la_down = lora_a_stage(b, lora, l, "down", f"ffn.{l}", Wait(ffn, len(f_tiles)))
        x_wait = residual_stage(b, lc, [f"ffn.{l}", L + "w_down", f"mid.{l}"], f"down.{l}", f"x.{l + 1}",
                                Wait(ffn, len(f_tiles)), xn, down_tiles, f"L{l}.down",
                                lora_operands(lora, l, "down", l + 1, "qkv"), la_down)
    lm = C("lm")
    fin, x_wait = normed(f"x.{cfg.n_layers}", "norm", x_wait, f"xn.{cfg.n_layers}")
    for t, (r0, n) in enumerate(lm_tiles):
        if lc.fuse_argmax:
            b.task(Op.RMS_LINEAR_ARGMAX, fin + ["lm_head"], ["logits", "best"], [x_wait], lm,
                   f"lm_head[{r0}]", row0=r0, nrows=n, eps=eps, norm=norm, tile=t)
        else:
            b.task(Op.RMS_LINEAR, fin + ["lm_head"], ["logits"], [x_wait], lm, f"lm_head[{r0}]",
                   row0=r0, nrows=n, eps=eps, norm=norm)
    if lc.sample:
        b.task(Op.SAMPLE, ["logits", "best", "sampling", "seed", "pos"], ["next_token"], [Wait(lm, len(lm_tiles))],
               C("done"), "sample", tile_rows=lc.lm_rows)
    else:
        b.task(Op.ARGMAX, ["best" if lc.fuse_argmax else "logits"], ["next_token"], [Wait(lm, len(lm_tiles))],
               C("done"), "argmax")
    return tag_handoffs(prog, plain=() if lc.tag_expert_h else ("expert_h.",)) if lc.tagged else prog


def residual_stage(b: TaskBuilder, lc: ScheduleConfig, ins: list[str], plain: str, out: str, wait: Wait, signal: int,
                   tiles, label: str, lora=([], [], {}), lora_waits: list[Wait] = ()) -> Wait:
    """out = ins[2] + W @ ins[0] by row tiles (ins = [a, w, res]); returns the wait for all of out.
    Fused: LINEAR_RESIDUAL tiles signal `signal`, with their LoRA operands (lora_operands) and the wait
    for their LORA_A tasks, if any. Unfused: LINEAR tiles write `plain`, then one ADD."""
    if lc.fuse_residual:
        l_ins, l_outs, lp = lora
        extra = lora_wait(l_ins, lora_waits)
        for t, (r0, n) in enumerate(tiles):
            b.task(Op.LINEAR_RESIDUAL, ins + l_ins, [out] + l_outs, [wait] + extra, signal, f"{label}[{r0}]",
                   row0=r0, nrows=n, lora_t=t if l_ins and l_ins[3] else 0, **lp)
        return Wait(signal, len(tiles))
    done = b.p.add_counter(f"{plain}.tiles")
    for r0, n in tiles:
        b.task(Op.LINEAR, [ins[0], ins[1], None, None], [plain], [wait], done, f"{label}[{r0}]", row0=r0, nrows=n,
               b0=0, nb=1, act=0, mult=0.0)
    b.task(Op.ADD, [ins[2], plain], [out], [Wait(done, len(tiles))], signal, f"{label}.add",
           row0=0, nrows=sum(n for _, n in tiles))
    return Wait(signal, 1)
