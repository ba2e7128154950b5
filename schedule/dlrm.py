"""DLRM inference through the same IR, validator, packing and VMs as the decoders: the model's shape
(DLRMConfig), its presets, its weights and its lowering.

One step runs a batch of B samples. Dense features go through the bottom MLP (Linear + ReLU layers)
to z [B, D]; each of the S sparse features picks a row of its own table by the modulus hash
(x + 1) % rows; the interaction takes z and the S embeddings, t = (z, e_1 .. e_S), and emits z with
every dot <t_i, t_j>, i > j; the top MLP (Linear + ReLU, the last Linear + sigmoid) makes the
probability [B, top[-1]].

Lowered (every task over one batch tile of `batch_tile` samples, so batch tiles run through the
layers independently):
  bottom layer l tiles  wait bot{l-1}.b (all its row tiles)   signal bot{l}.b       (LINEAR, relu, bias)
  table f gathers       no wait                               signal emb.b          (EMB_GATHER)
  interaction           wait bot{last}.b and emb.b            signal inter.b        (INTERACT)
  top layer l tiles     wait inter.b / top{l-1}.b             signal top{l}.b       (LINEAR, relu or sigmoid)

Weights take the names of the reference DLRM's modules (bot_l.{2i}, emb_l.{f}, top_l.{2i}: Linear at
the even places of each Sequential). A layer's input width is padded to a multiple of 8 with zero
weight columns, and a hidden layer's outputs to a multiple of 8 with zero rows and biases, so every
row is whole 16-byte pieces; the program's `dense` input is [B, dense rounded up to 8], zero-padded
(pad_dense). Tables are never copied or padded: the tasks gather the rows they need.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch

from megavm.core.errors import ConfigError, InputError
from megavm.core.limits import MAX_K, MAX_TILE_ROWS
from megavm.core.types import BufferKind as K
from megavm.core.types import DType
from megavm.instructions import Op, spec
from megavm.instructions.activations import CODE as ACT
from megavm.instructions.interact import width
from megavm.schedule.ir import Program, Task, Wait

MAX_BATCH = 4096

# the Criteo Kaggle display-advertising set's 26 table sizes, as the reference DLRM runs it
# (--arch-embedding-size 1460-583-...-142572, --arch-mlp-bot 13-512-256-64-16, --arch-mlp-top 512-256-1)
KAGGLE_TABLES = (1460, 583, 10131227, 2202608, 305, 24, 12517, 633, 3, 93145, 5683, 8351593, 3194, 27, 14992,
                 5461306, 10, 5652, 2173, 4, 7046547, 18, 15, 286181, 105, 142572)


def pad8(n: int) -> int:
    return -(-n // 8) * 8


@dataclass(frozen=True)
class DLRMConfig:
    dense: int = 13                                  # dense features per sample
    bottom: tuple[int, ...] = (512, 256, 64, 16)     # bottom MLP widths; the last is the embedding dim
    tables: tuple[int, ...] = KAGGLE_TABLES          # rows of each sparse feature's embedding table
    top: tuple[int, ...] = (512, 256, 1)             # top MLP widths; the last layer has the sigmoid

    def __post_init__(self):
        object.__setattr__(self, "bottom", tuple(self.bottom))
        object.__setattr__(self, "tables", tuple(self.tables))
        object.__setattr__(self, "top", tuple(self.top))
        for name, v in (("dense", (self.dense,)), ("bottom", self.bottom), ("tables", self.tables), ("top", self.top)):
            if not v or any(isinstance(x, bool) or not isinstance(x, int) or x < 1 for x in v):
                raise ConfigError(f"DLRM {name}={v!r} must be one or more positive integers")
        if (len(self.tables) + 1) * self.dim > MAX_K:
            raise ConfigError(f"DLRM: {len(self.tables) + 1} interaction vectors of {self.dim} exceed {MAX_K} floats")

    @property
    def dim(self) -> int:
        return self.bottom[-1]

    @property
    def n_sparse(self) -> int:
        return len(self.tables)

    @property
    def interaction(self) -> int:
        return width(self.n_sparse, self.dim)

    def layers(self) -> list[tuple[str, int, int, int, int, str]]:
        """(weight name prefix, in, out, padded in, padded out, activation) of every MLP layer."""
        out = []
        for part, ins, widths, last_act in (("bot_l", self.dense, self.bottom, "relu"),
                                            ("top_l", self.interaction, self.top, "sigmoid")):
            for i, n in enumerate(widths):
                k = ins if i == 0 else widths[i - 1]
                last = i == len(widths) - 1
                # the last layer's width is a real shape (z's dim, the probabilities), not padded
                out.append((f"{part}.{2 * i}", k, n, pad8(k), n if last else pad8(n), last_act if last else "relu"))
        return out

    def to_dict(self) -> dict:
        return asdict(self)


PRESETS: dict[str, DLRMConfig] = {
    "dlrm-tiny": DLRMConfig(dense=13, bottom=(32, 16, 8), tables=(7, 100, 1000, 3), top=(24, 1)),
    "dlrm-kaggle": DLRMConfig(),
}


@dataclass(frozen=True)
class DLRMSchedule:
    batch: int = 1                 # samples per step
    dtype: str = "f32"             # MLP weights and tables; activations are f32
    n_sms: int = 132
    strategy: str = "balanced"
    batch_tile: int = 0            # samples per task; 0: picked
    rows: int = 0                  # MLP tile height; 0: picked per layer for about one tile per SM

    def to_dict(self) -> dict:
        return asdict(self)


def resolve_schedule(sc: DLRMSchedule) -> DLRMSchedule:
    if not 1 <= sc.batch <= MAX_BATCH:
        raise ConfigError(f"batch={sc.batch} must be in [1, {MAX_BATCH}]")
    if sc.n_sms < 1:
        raise ConfigError(f"n_sms={sc.n_sms} must be >= 1")
    if sc.dtype not in ("f32", "bf16"):
        raise ConfigError(f"dtype={sc.dtype!r} must be f32 or bf16")
    if sc.batch_tile < 0 or sc.rows < 0 or sc.rows > MAX_TILE_ROWS:
        raise ConfigError(f"batch_tile={sc.batch_tile} and rows={sc.rows} must be >= 0 (rows <= {MAX_TILE_ROWS})")
    return DLRMSchedule(**{**sc.to_dict(), "batch_tile": min(sc.batch, sc.batch_tile or 8)})


def _row_tiles(n: int, rows: int, n_sms: int, batch_tiles: int) -> list[tuple[int, int]]:
    if not rows:      # about one task per SM over the layer's batch tiles, 8-row multiples
        rows = min(MAX_TILE_ROWS, max(8, pad8(-(-n * batch_tiles // n_sms))))
    return [(r, min(rows, n - r)) for r in range(0, n, rows)]


def lower_dlrm(cfg: DLRMConfig, sc: DLRMSchedule = DLRMSchedule()) -> Program:
    sc = resolve_schedule(sc)
    B, D, S, wdt = sc.batch, cfg.dim, cfg.n_sparse, DType.parse(sc.dtype)
    layers = cfg.layers()
    nbot = len(cfg.bottom)
    prog = Program(meta={"model": {"dlrm": cfg.to_dict()}, "schedule": sc.to_dict(), "inputs": ["dense", "sparse"],
                         "outputs": ["prob"]})
    P, C = prog.add_buffer, prog.add_counter
    for name, _, _, kp, np_, _ in layers:
        P(f"{name}.weight", K.WEIGHT, wdt, (np_, kp))
        P(f"{name}.bias", K.WEIGHT, wdt, (np_,))
    for f, rows in enumerate(cfg.tables):
        P(f"emb_l.{f}.weight", K.WEIGHT, wdt, (rows, D))
    P("dense", K.INPUT, DType.F32, (B, pad8(cfg.dense)))
    P("sparse", K.INPUT, DType.I32, (B, S))
    outs = []
    for i, (name, _, _, _, np_, _) in enumerate(layers):
        last = i == len(layers) - 1
        outs.append("prob" if last else f"{name}.y")
        P(outs[-1], K.OUTPUT if last else K.ACTIVATION, DType.F32, (B, np_))
    P("emb", K.ACTIVATION, DType.F32, (B, S, D))
    P("inter", K.ACTIVATION, DType.F32, (B, pad8(cfg.interaction)))

    tiles = [(b0, min(sc.batch_tile, B - b0)) for b0 in range(0, B, sc.batch_tile)]

    def task(op, ins, out, waits, signal, label, **params):
        p = prog
        t = Task(int(op), tuple(-1 if n is None else p.buffer_id(n) for n in ins), (p.buffer_id(out),),
                 tuple(waits), signal, params, label)
        p.add_task(t)
        t.est_bytes, t.est_flops = spec(op).cost(params, *p.operands(len(p.tasks) - 1))

    emb = [C(f"emb.b{b0}") for b0, _ in tiles]
    for f in range(S):
        for (b0, nb), c in zip(tiles, emb):
            task(Op.EMB_GATHER, [f"emb_l.{f}.weight", "sparse"], "emb", (), c, f"emb[{f}, b{b0}]",
                 feature=f, b0=b0, nb=nb)
    prev_in, prev_wait = "dense", [None] * len(tiles)
    inter = [C(f"inter.b{b0}") for b0, _ in tiles]
    for i, (name, _, _, kp, np_, act) in enumerate(layers):
        if i == nbot:                                  # the interaction, between the MLPs
            for (b0, nb), c, w, e in zip(tiles, inter, prev_wait, emb):
                task(Op.INTERACT, [prev_in, "emb"], "inter", (w, Wait(e, S)), c, f"inter[b{b0}]", b0=b0, nb=nb)
            prev_in, prev_wait = "inter", [Wait(c, 1) for c in inter]
        rts = _row_tiles(np_, sc.rows, sc.n_sms, len(tiles))
        done = [C(f"{name}.b{b0}") for b0, _ in tiles]
        for (b0, nb), c, w in zip(tiles, done, prev_wait):
            for r0, n in rts:
                task(Op.LINEAR, [prev_in, f"{name}.weight", f"{name}.bias", None], outs[i], () if w is None else (w,),
                     c, f"{name}[b{b0}, {r0}]", row0=r0, nrows=n, b0=b0, nb=nb, act=ACT[act], mult=0.0)
        prev_in, prev_wait = outs[i], [Wait(c, len(rts)) for c in done]
    return prog


# -- weights -------------------------------------------------------------------------------------
def state_shapes(cfg: DLRMConfig) -> dict[str, tuple[int, ...]]:
    """The reference DLRM module's parameters (unpadded), by name."""
    shapes: dict[str, tuple[int, ...]] = {}
    for name, k, n, *_ in cfg.layers():
        shapes[f"{name}.weight"], shapes[f"{name}.bias"] = (n, k), (n,)
    for f, rows in enumerate(cfg.tables):
        shapes[f"emb_l.{f}.weight"] = (rows, cfg.dim)
    return shapes


def random_state(cfg: DLRMConfig, dtype: torch.dtype = torch.float32, seed: int = 0, device="cpu") -> dict:
    """Seeded weights like the reference's initialisation: N(0, sqrt(2 / (in + out))) weights,
    N(0, sqrt(1 / out)) biases, U(-sqrt(1 / rows), sqrt(1 / rows)) table entries."""
    g = torch.Generator(device=device).manual_seed(seed)
    out = {}
    for name, shape in state_shapes(cfg).items():
        if name.startswith("emb_l"):
            t = (torch.rand(shape, generator=g, device=device) * 2 - 1) * math.sqrt(1 / shape[0])
        elif name.endswith(".weight"):
            t = torch.randn(shape, generator=g, device=device) * math.sqrt(2 / (shape[0] + shape[1]))
        else:
            t = torch.randn(shape, generator=g, device=device) * math.sqrt(1 / shape[0])
        out[name] = t.to(dtype)
    return out


def program_weights(cfg: DLRMConfig, state: dict, dtype: str = "f32") -> dict[str, torch.Tensor]:
    """The reference module's parameters -> the program's weight buffers: MLP weights zero-padded to
    whole 8-column rows (and hidden layers to whole 8-row outputs), tables passed through uncopied
    when already in the program's dtype."""
    dt = DType.parse(dtype).torch
    want = state_shapes(cfg)
    for name, shape in want.items():
        if name not in state:
            raise ConfigError(f"DLRM weights lack {name!r} (shape {shape})")
        if tuple(state[name].shape) != shape:
            raise ConfigError(f"DLRM weight {name!r} has shape {tuple(state[name].shape)}, expected {shape}")
    out = {}
    for name, k, n, kp, np_, _ in cfg.layers():
        w, b = state[f"{name}.weight"], state[f"{name}.bias"]
        out[f"{name}.weight"] = torch.nn.functional.pad(w.to(dt), (0, kp - k, 0, np_ - n))
        out[f"{name}.bias"] = torch.nn.functional.pad(b.to(dt), (0, np_ - n))
    for f in range(cfg.n_sparse):
        out[f"emb_l.{f}.weight"] = state[f"emb_l.{f}.weight"].to(dt)
    return out


def pad_dense(cfg: DLRMConfig, dense: torch.Tensor) -> torch.Tensor:
    """[B, dense] features -> the program's `dense` input, zero-padded to whole 8-column rows."""
    if dense.dim() != 2 or dense.shape[1] != cfg.dense:
        raise InputError(f"dense features have shape {tuple(dense.shape)}, expected (batch, {cfg.dense})")
    return torch.nn.functional.pad(dense.float(), (0, pad8(cfg.dense) - cfg.dense))
