"""What a program will need, computed from its configs before anything is built: how many tasks the
lowering makes (and the host memory to lower, validate and pack them), the bytes of its weights, KV
cache and activations. require() refuses, in one line with the figure and the limit, a request that
cannot fit (core/memory.py), so that a mistyped --capacity fails in a second instead of thrashing for
minutes."""
from __future__ import annotations

import math
from dataclasses import dataclass

from megavm.core.errors import UserError
from megavm.core.limits import MAX_K
from megavm.core.types import DType
from megavm.instructions.attention import combine_scratch
from megavm.schedule.config import ScheduleConfig, resolve
from megavm.schedule.models import ModelConfig
from megavm.schedule.weights import hf_shapes

TASK_HOST_BYTES = 8192           # lowering, validating and packing one task (measured about 4-5 KiB at peak)


@dataclass(frozen=True)
class Footprint:
    tasks: int
    compile_bytes: int           # host memory to lower, validate and pack the program
    weight_bytes: int            # the model's weights in the program's dtype
    kv_bytes: int                # the KV cache of every layer
    arena_bytes: int             # the activations and outputs of one step


def _tiles(n: int, rows: int) -> int:
    return -(-n // rows)


def footprint(cfg: ModelConfig, sc: ScheduleConfig) -> Footprint:
    lc = resolve(cfg, sc)
    isz = DType.parse(lc.dtype).itemsize
    kvh, g, hd, d, f, v = cfg.n_kv_heads, cfg.group, cfg.head_dim, cfg.dim, cfg.ffn_dim, cfg.vocab
    nblk = math.ceil(lc.capacity / lc.kv_block)
    per_layer = (kvh * (lc.q_tiles + 2 * lc.kv_tiles + nblk + 1) + _tiles(d, lc.o_rows) + _tiles(f, lc.ffn_rows)
                 + _tiles(d, lc.down_rows) + 3 * kvh + 4)            # the last terms: the unfused forms' tasks
    tasks = _tiles(d, lc.embed_cols) + cfg.n_layers * per_layer + _tiles(v, lc.lm_rows) + 2
    weights = sum(math.prod(s) for s in hf_shapes(cfg).values()) * isz
    kv = 2 * cfg.n_layers * kvh * lc.capacity * hd * isz
    arena = 4 * (cfg.n_layers * (kvh * nblk * g * (hd + 2) + 4 * cfg.n_heads * hd + 6 * d + f) + 2 * v)
    return Footprint(tasks, tasks * TASK_HOST_BYTES, weights, kv, arena)


def require_attention_split(cfg: ModelConfig, sc: ScheduleConfig) -> None:
    """UserError, in one line, when the KV cache capacity needs more attention blocks per KV head than
    one combine holds in shared memory (instructions/attention.py: combine_scratch): a program that
    would be lowered only for the validator to refuse it."""
    lc = resolve(cfg, sc)
    nblk = math.ceil(lc.capacity / lc.kv_block)
    # fuse_combine: the o-projection combines every KV head beside its activation vector
    heads, room = (cfg.n_kv_heads, MAX_K - cfg.n_heads * cfg.head_dim) if lc.fuse_combine else (1, MAX_K)
    most = (room // (heads * cfg.group) - 1) // 2
    if combine_scratch(heads, nblk, cfg.group) > room:
        raise UserError(f"capacity {lc.capacity} needs {nblk} attention blocks of {lc.kv_block} keys per KV head; "
                        f"a combine of {cfg.group} query heads holds at most {most} (at most "
                        f"{most * lc.kv_block} positions at that block size): lower --capacity")
