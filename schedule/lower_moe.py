"""The lowering of a mixture-of-experts MLP (schedule/lower.py calls it for each MoE layer): router tiles,
ROUTE, the shared expert, the chosen experts' GLU and down tiles (docs/moe.md)."""
from __future__ import annotations

from megavm.instructions import Op
from megavm.instructions.activations import CODE as ACT_CODE
from megavm.instructions.routing import SCORE_FNS
from megavm.schedule.builder import TaskBuilder, row_tiles
from megavm.schedule.config import ScheduleConfig
from megavm.schedule.ir import Wait
from megavm.schedule.models import ModelConfig


def experts_stage(b: TaskBuilder, cfg: ModelConfig, lc: ScheduleConfig, l: int, hin: list[str], wait: Wait,
                  signal: int) -> Wait:
    """A mixture-of-experts MLP: router logit tiles, ROUTE (ids and weights of the top_k experts, by
    score or by the token's hash-table row), a shared expert's RMS_GLU tiles if any, EXPERT_GLU tiles
    per chosen expert, EXPERT_DOWN tiles summing the shared and chosen experts into the residual
    stream x_{l+1}. The expert tiles wait on ROUTE's counter first: their loaders stream the chosen
    experts' rows as soon as the ids are written (late-bound streams). A hash-routed layer's ids come
    from a ROUTE task with no wait (the token's table row), its weights from one after the logits."""
    L, C = f"layers.{l}.", b.p.add_counter
    norm = int(lc.fuse_norm)
    router, route, glu = C(f"L{l}.router"), C(f"L{l}.route"), C(f"L{l}.experts")
    r_tiles = row_tiles(cfg.n_experts, lc.router_rows)
    for r0, n in r_tiles:
        b.task(Op.RMS_LINEAR, hin + [L + "router"], [f"router_logits.{l}"], [wait], router, f"L{l}.router[{r0}]",
               row0=r0, nrows=n, eps=cfg.norm_eps, norm=norm)
    score = SCORE_FNS.index(cfg.router_score)
    route_params = dict(score=score, renorm=int(cfg.router_renorm), eps=cfg.router_eps, scale=cfg.router_scale)
    if cfg.is_hash(l):
        # the ids depend on the token alone: a root task writes them at the step's start, so the expert
        # tiles' loaders stream the chosen experts as early as a dense layer's; the weights follow the logits
        table = [L + "hash_table", "token"]
        ids_ready = C(f"L{l}.hash")
        b.task(Op.ROUTE, [None, None] + table, [f"expert_ids.{l}", None], [], ids_ready, f"L{l}.hash_ids",
               **route_params)
        b.task(Op.ROUTE, [f"router_logits.{l}", None] + table, [None, f"expert_weights.{l}"],
               [Wait(router, len(r_tiles))], route, f"L{l}.route", **route_params)
        glu_waits, down_waits = [Wait(ids_ready, 1), wait], [Wait(ids_ready, 1), Wait(route, 1)]
    else:
        bias = L + "router_bias" if cfg.router_bias else None
        b.task(Op.ROUTE, [f"router_logits.{l}", bias, None, None], [f"expert_ids.{l}", f"expert_weights.{l}"],
               [Wait(router, len(r_tiles))], route, f"L{l}.route", **route_params)
        glu_waits = down_waits = [Wait(route, 1)]
    act, limit = ACT_CODE[cfg.mlp_act], cfg.swiglu_limit
    s_tiles = row_tiles(cfg.shared_ffn, lc.ffn_rows) if cfg.shared_ffn else []
    for r0, n in s_tiles:               # the shared expert: dense, its weights stream ahead of the wait
        b.task(Op.RMS_GLU, hin + [L + "shared_gate", L + "shared_up"], [f"shared_h.{l}"], [wait], glu,
               f"L{l}.shared[{r0}]", row0=r0, nrows=n, eps=cfg.norm_eps, norm=norm, act=act, limit=limit)
    g_tiles = row_tiles(cfg.expert_ffn, lc.expert_rows)
    for j in range(cfg.top_k):
        for r0, n in g_tiles:
            b.task(Op.EXPERT_GLU, hin + [L + "experts_gate", L + "experts_up", f"expert_ids.{l}"], [f"expert_h.{l}"],
                   glu_waits, glu, f"L{l}.expert{j}[{r0}]", row0=r0, nrows=n, eps=cfg.norm_eps, norm=norm,
                   act=act, slot=j, limit=limit)
    shared = [f"shared_h.{l}", L + "shared_down"] if cfg.shared_ffn else []
    d_tiles = row_tiles(cfg.dim, lc.expert_down_rows)
    for r0, n in d_tiles:
        b.task(Op.EXPERT_DOWN, [f"expert_h.{l}", L + "experts_down", f"expert_ids.{l}", f"expert_weights.{l}",
                                f"mid.{l}"] + shared, [f"x.{l + 1}"],
               down_waits + [Wait(glu, cfg.top_k * len(g_tiles) + len(s_tiles))],
               signal, f"L{l}.experts_down[{r0}]", row0=r0, nrows=n)
    return Wait(signal, len(d_tiles))
