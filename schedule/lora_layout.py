"""Where LoRA adapters live in a program (instructions/lora.py says how the tasks use them).

The projections fall into four groups by the vector they read: q/k/v read x (layer input), o reads the
attention output, gate/up read mid (after the attention residual), down reads the GLU output. Each
group has one stacked A, [adapters + 1, columns, input length], its targets' rows of A side by side
(rank R each; gate and up always both when either is targeted, since one tile computes both), and the
buffer lora_u.<group>.<layer> [producers, columns] of the partial products A v that the tasks writing
v leave (for a normed group, A (g v) with g its RMSNorm weight, which those tasks apply). Each target has its stacked B [adapters + 1, output rows, R] (gate and up: one buffer, the
gate's rows then the up's). Slot 0 is all zeros (id 0: no adapter); an adapter of rank r < R fills
the first r columns. A holds the adapter's values unchanged; the scale is folded into B, and q and k
rows of B are interleaved as the program's wq and wk are (schedule/weights.py).

Who writes lora_u: by default (`ScheduleConfig.lora_a_tasks`) a few LORA_A tasks a group, each some rows
of A (a_tiles) over the finished input, so lora_u has one row; with lora_a_tasks=False the tasks that
write the input write a row each besides (the producers: EMBED, the down tiles, the combines, the o
tiles, the RMS_GLU tiles; measured slower, docs/performance.md).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from megavm.core.errors import ConfigError
from megavm.core.limits import MAX_K
from megavm.core.types import BufferKind as K
from megavm.core.types import DType
from megavm.instructions import Op
from megavm.schedule.adapters import TARGETS, features
from megavm.schedule.ir import Wait
from megavm.schedule.models import ModelConfig

GROUP_OF = {"q": "qkv", "k": "qkv", "v": "qkv", "o": "o", "gate": "gu", "up": "gu", "down": "down"}
NORMED = {"qkv": "attn_norm", "gu": "ffn_norm"}          # the RMSNorm weight a normed group's producers apply
ID = "adapter"                                           # the runtime input: the step's adapter id
A_SLICE_BYTES = 48 * 1024                                # about what a LORA_A task copies of A[id]


@dataclass(frozen=True)
class LoraLayout:
    cfg: ModelConfig
    adapters: int                    # ids 1..adapters; 0 means none
    rank: int
    targets: tuple[str, ...]
    a_tasks: bool = True             # LORA_A tasks write lora_u (else the input's producers do)
    itemsize: int = 2                # bytes of an element of A (the program's weight dtype)
    a_rows: int = 0                  # rows of A a LORA_A task takes (0: about A_SLICE_BYTES)

    @staticmethod
    def of(cfg: ModelConfig, sc) -> LoraLayout | None:
        if not sc.lora_adapters:
            return None
        bad = [t for t in sc.lora_targets if t not in TARGETS]
        if bad or not sc.lora_targets:
            raise ConfigError(f"lora_targets={list(sc.lora_targets)}: name some of {list(TARGETS)}")
        if sc.lora_adapters < 0 or sc.lora_rank < 1:
            raise ConfigError(f"lora_adapters={sc.lora_adapters} and lora_rank={sc.lora_rank} must be >= 1")
        if sc.lora_a_rows < 0:
            raise ConfigError(f"lora_a_rows={sc.lora_a_rows} must be >= 0 (0: about {A_SLICE_BYTES} bytes of A a task)")
        for flag, want in (("fuse_norm", True), ("fuse_rope", True), ("fuse_residual", True), ("fuse_combine", False)):
            if getattr(sc, flag) != want:
                raise ConfigError(f"LoRA adapters are lowered with the default fusions only ({flag}={want})")
        targets = set(sc.lora_targets)
        if targets & {"gate", "up"}:
            targets |= {"gate", "up"}
        return LoraLayout(cfg, sc.lora_adapters, sc.lora_rank, tuple(t for t in TARGETS if t in targets),
                          sc.lora_a_tasks, DType.parse(sc.dtype).itemsize, sc.lora_a_rows)

    # -- shapes --------------------------------------------------------------------------------
    def members(self, group: str) -> list[str]:
        return [t for t in self.targets if GROUP_OF[t] == group]

    def in_len(self, group: str) -> int:
        return features(self.cfg, self.members(group)[0])[0]

    def out_rows(self, target: str) -> int:
        return features(self.cfg, target)[1]

    def uses_a_tasks(self, group: str) -> bool:
        """Whether LORA_A tasks write the group's partial products: by default, where one row of its A and
        its input fit a task's shared memory (f32 inputs longer than 8192 do not: their producers do)."""
        from megavm.instructions.lora_a import fits
        return self.a_tasks and bool(self.members(group)) and fits(1, self.in_len(group), self.itemsize)

    def a_tiles(self, group: str) -> list[tuple[int, int]]:
        """(row0, nrows) of the group's LORA_A tasks: rows of its A[id] of about A_SLICE_BYTES a task (or
        a_rows), as evenly as that allows, each task's rows and its whole input within the block's shared
        memory."""
        from megavm.instructions.lora_a import fits
        L, J = self.in_len(group), self.rank * len(self.members(group))
        row = L * self.itemsize
        most = max(n for n in range(0, J + 1) if n == 0 or fits(n, L, self.itemsize))
        if most == 0:
            raise ConfigError(f"LoRA on {self.members(group)}: a row of A of {L} elements and the input do not "
                              f"fit a LORA_A task's {4 * MAX_K} bytes of shared memory")
        tasks = -(-J // min(most, self.a_rows or max(1, A_SLICE_BYTES // row)))
        n = -(-J // tasks)
        return [(r0, min(n, J - r0)) for r0 in range(0, J, n)]

    def a_operands(self, l: int, group: str) -> tuple[str, str, str | None]:
        """(a, u, gamma) of the LORA_A tasks of group at layer l."""
        return (f"layers.{l}.lora_a.{group}", f"lora_u.{group}.{l}",
                f"layers.{l}.{NORMED[group]}" if group in NORMED else None)

    @staticmethod
    def b_name(l: int, target: str) -> str:
        return f"layers.{l}.lora_b.{'gate_up' if target in ('gate', 'up') else target}"

    def add_buffers(self, P, wdt: DType, producers) -> None:
        """The stacked A and B weights, the partial products (a row per LORA_A task, or, without them,
        producers(group, layer): how many tasks write that group's input), and the adapter id input."""
        na, R = self.adapters + 1, self.rank
        P(ID, K.INPUT, DType.I32, (1,))
        for l in range(self.cfg.n_layers):
            for g in ("qkv", "o", "gu", "down"):
                m = self.members(g)
                if m:
                    P(f"layers.{l}.lora_a.{g}", K.WEIGHT, wdt, (na, R * len(m), self.in_len(g)))
                    rows = 1 if self.uses_a_tasks(g) else producers(g, l)
                    P(f"lora_u.{g}.{l}", K.ACTIVATION, DType.F32, (rows, R * len(m)))
            for t in self.targets:
                if t != "up":
                    rows = self.out_rows(t) * (2 if t == "gate" else 1)
                    P(self.b_name(l, t), K.WEIGHT, wdt, (na, rows, R))

    # -- operands -------------------------------------------------------------------------------
    def consume(self, l: int, target: str) -> tuple[list[str | None], int]:
        """(lora_u, lora_b, adapter) operands of a projection tile of target at layer l, and its lora_off."""
        if target not in self.targets:
            return [None, None, None], 0
        g = GROUP_OF[target]
        return [f"lora_u.{g}.{l}", self.b_name(l, target), ID], self.members(g).index(target) * self.rank

    def produce(self, l: int, group: str) -> tuple[str | None, str | None, str | None]:
        """(next_a, next_u, next_gamma) of a task writing the input of group at layer l (Nones: no LoRA
        there; next_gamma None: the group is not normed)."""
        if l >= self.cfg.n_layers or not self.members(group) or self.uses_a_tasks(group):
            return None, None, None
        gamma = f"layers.{l}.{NORMED[group]}" if group in NORMED else None
        return f"layers.{l}.lora_a.{group}", f"lora_u.{group}.{l}", gamma


def consume(layout: LoraLayout | None, l: int, target: str) -> tuple[list[str | None], int]:
    return layout.consume(l, target) if layout else ([None, None, None], 0)


def produce(layout: LoraLayout | None, l: int, group: str) -> tuple[str | None, str | None, str | None]:
    return layout.produce(l, group) if layout else (None, None, None)


def lora_weights(layout: LoraLayout, adapters: list, weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The stacked A and B buffers of the adapters (ids 1..n, schedule/adapters.Adapter) in the dtype and
    on the device of the program's weights (by buffer name)."""
    from megavm.schedule.weights import interleave_rope_rows
    c, R = layout.cfg, layout.rank
    if len(adapters) != layout.adapters:
        raise ConfigError(f"the program holds {layout.adapters} adapters, {len(adapters)} given")
    dt, dev = weights["tok_emb"].dtype, weights["tok_emb"].device
    out: dict[str, torch.Tensor] = {}
    for i, ad in enumerate(adapters, start=1):
        if ad.rank > R or not set(ad.targets) <= set(layout.targets):
            raise ConfigError(f"adapter {i} ({ad.path}): rank {ad.rank} on {list(ad.targets)} does not fit the "
                              f"program's rank {R} on {list(layout.targets)}")
    for l in range(c.n_layers):
        for g in ("qkv", "o", "gu", "down"):
            m = layout.members(g)
            if not m:
                continue
            a = torch.zeros(layout.adapters + 1, R * len(m), layout.in_len(g))
            for i, ad in enumerate(adapters, start=1):
                for j, t in enumerate(m):
                    if t in ad.targets:
                        a[i, j * R:j * R + ad.rank] = ad.a[(l, t)]
            out[f"layers.{l}.lora_a.{g}"] = a.to(dt).to(dev).contiguous()
        for t in layout.targets:
            if t == "up":
                continue
            parts = ("gate", "up") if t == "gate" else (t,)
            b = torch.zeros(layout.adapters + 1, layout.out_rows(t) * len(parts), R)
            for i, ad in enumerate(adapters, start=1):
                for k, part in enumerate(parts):
                    if part not in ad.targets:
                        continue
                    rows = ad.b[(l, part)] * ad.scale
                    if part in ("q", "k"):
                        rows = interleave_rope_rows(rows, c.head_dim)
                    n = layout.out_rows(part)
                    b[i, k * n:(k + 1) * n, :ad.rank] = rows
            out[layout.b_name(l, t)] = b.to(dt).to(dev).contiguous()
    return out


# -- the lowering's LoRA tasks and operands (schedule/lower.py; b: its task builder) -----------------
def lora_a_stage(b, lora: LoraLayout | None, l: int, group: str, v: str, wait: Wait) -> list[Wait]:
    """The LORA_A tasks of group at layer l (lora_layout.a_tiles: rows of its A, each over the whole input
    v once `wait` is met, so the wait is polled where v is tagged), emitted before the group's projection
    tiles (no later: those wait on them; no earlier: they wait on what comes before), so that round robin
    gives them SMs of their own where the projection tiles leave some; returns the projection tiles'
    extra wait on them ([] where the group has no LoRA or the producers write the partial products)."""
    if not lora or not lora.uses_a_tasks(group):
        return []
    done = b.p.add_counter(f"L{l}.lora_a.{group}")
    a, u, gamma = lora.a_operands(l, group)
    tiles = lora.a_tiles(group)
    for r0, n in tiles:
        b.task(Op.LORA_A, [v, a, ID, gamma], [u], [wait], done, f"L{l}.lora_a.{group}[{r0}]", row0=r0, nrows=n)
    return [Wait(done, len(tiles))]


def lora_wait(consume_ins: list, waits: list[Wait]) -> list[Wait]:
    """A projection tile's wait on its group's LORA_A tasks where it takes a low-rank term."""
    return list(waits) if consume_ins and consume_ins[0] else []


def lora_operands(lora: LoraLayout | None, l: int, target: str, next_l: int, next_group: str):
    """A tile's LoRA operands as a consumer of target and a producer for next_group of layer next_l:
    (inputs lora_u, lora_b, adapter, next_a and, but for RMS_GLU, next_gamma; outputs next_u; params
    but lora_t)."""
    ins, off = consume(lora, l, target)
    next_a, next_u, next_g = produce(lora, next_l, next_group)
    if next_a:
        ins[2] = ID
    return ins + [next_a] + ([next_g] if target != "gate" else []), [next_u], {"lora_off": off}
