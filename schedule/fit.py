"""q/k/v tile counts that leave no attention partial behind its own layer's q/k/v stage.

Round robin deals a layer's tasks to consecutive queues in program order: its q/k/v stage (q, k and v
tiles, with their finishers and LoRA A tasks where present), then its partials. When those outnumber
the queues, the last ones land right behind q/k/v tiles of the same layer and start only when those end
(schedule.assign.crowded_partials). Session 41's q tile sweeps on the H100 found every configuration with
many such partials 1.5-10% slower (docs/performance.md). `ScheduleConfig(fit_chain=True)` takes the
default counts and, where the layer's stage and partials do not fit, tries fewer k/v tiles, then fewer q
tiles, never making a tile taller than the default's tallest unless it stays within FIT_TILE_WEIGHTS.
Measured in session 42 it was within noise (the crowding goes with the slower counts but does not make
them slow), and with one KV block a head by default (attn_direct) the presets' partials at short context
are no longer crowded; it stays a switch and a tuner knob.
"""
from __future__ import annotations

from dataclasses import replace

from megavm.instructions import Op
from megavm.schedule.config import ScheduleConfig, resolve, split_head_norm
from megavm.schedule.lower import lower
from megavm.schedule.models import ModelConfig

# the most weights a tile may grow to when fewer tiles make the chain fit (256 KiB in bf16: the default q
# tile bound of session 41, before the sized rings halved it, schedule/config.py: Q_TILE_WEIGHTS)
FIT_TILE_WEIGHTS = 128 * 1024


def chain_tasks(cfg: ModelConfig, sc: ScheduleConfig) -> int:
    """Queued tasks of one layer from its first task through its last attention partial: the run that
    round robin deals to consecutive queues. Counted on a one-layer lowering (a small vocabulary: the LM
    head's tiles come after it)."""
    one = replace(cfg, n_layers=1, vocab=min(cfg.vocab, 256), dense_layers=tuple(l for l in cfg.dense_layers if l < 1))
    p = lower(one, sc)
    dealt = [t for t in p.tasks if not t.inline]
    layer = [i for i, t in enumerate(dealt) if t.label.startswith("L0.")]
    partials = [i for i in layer if dealt[i].opcode == Op.ATTN_PARTIAL]
    return partials[-1] - layer[0] + 1 if partials else 0


def fit_chain(cfg: ModelConfig, sc: ScheduleConfig) -> ScheduleConfig:
    """sc with q_tiles and kv_tiles set: the defaults where a layer's chain fits its n_sms queues, else
    fewer k/v tiles, then fewer q tiles, as long as no tile grows taller than the default's tallest
    beyond FIT_TILE_WEIGHTS weights; the defaults where nothing fits. Counts set by the caller (q_tiles,
    kv_tiles, qkv_rows) and whole-head tiles (per-head norms without the split) are left as they are; sc
    itself without fit_chain."""
    if not sc.fit_chain:
        return sc
    base = replace(sc, fit_chain=False)
    lc = resolve(cfg, base)
    if sc.q_tiles or sc.kv_tiles or sc.qkv_rows or (cfg.qk_norm and not split_head_norm(cfg, lc)):
        return base
    q0, kv0, hd, gh = lc.q_tiles, lc.kv_tiles, cfg.head_dim, cfg.group * cfg.head_dim
    tallest = max(FIT_TILE_WEIGHTS, cfg.dim * max(-(-gh // q0), -(-hd // kv0)))

    def fits(q: int, kv: int) -> bool:
        return chain_tasks(cfg, replace(base, q_tiles=q, kv_tiles=kv)) <= sc.n_sms

    if fits(q0, kv0):
        return replace(base, q_tiles=q0, kv_tiles=kv0)
    kv = kv0
    while kv > 1 and cfg.dim * -(-hd // (kv - 1)) <= tallest:
        kv -= 1
        if fits(q0, kv):
            return replace(base, q_tiles=q0, kv_tiles=kv)
    q = q0
    while q > 1 and cfg.dim * -(-gh // (q - 1)) <= tallest:
        q -= 1
        if fits(q, kv):
            return replace(base, q_tiles=q, kv_tiles=kv)
    return replace(base, q_tiles=q0, kv_tiles=kv0)
