"""The default q tile count: a share of one tile per SM, unless that makes a tile too large."""
import pytest

from megavm.core.limits import MAX_TILE_ROWS
from megavm.instructions import Op
from megavm.schedule.config import Q_TILE_SHARE, Q_TILE_WEIGHTS, ScheduleConfig, _qkv_tiles
from megavm.schedule.lower import lower, resolve
from megavm.schedule.models import PRESETS

FUSED = [n for n, c in PRESETS.items() if not c.qk_norm]


@pytest.mark.parametrize("name", FUSED)
@pytest.mark.parametrize("n_sms", [132, 78])
def test_default_q_tiles_are_fewer_and_taller(name, n_sms):
    """Fewer q tiles than one a SM (about Q_TILE_SHARE of them), the k and v tiles as before; the share
    gives way only where its tiles would pass Q_TILE_WEIGHTS weights."""
    cfg = PRESETS[name]
    gh = cfg.group * cfg.head_dim
    one, kv = _qkv_tiles(cfg, n_sms)
    lc = resolve(cfg, ScheduleConfig(n_sms=n_sms))
    assert lc.kv_tiles == kv
    assert round(one * Q_TILE_SHARE) <= lc.q_tiles <= max(one, -(-gh // MAX_TILE_ROWS))
    if lc.q_tiles > round(one * Q_TILE_SHARE):       # only the weight cap (or the tile row limit) keeps more
        assert (-(-gh // round(one * Q_TILE_SHARE))) * cfg.dim > Q_TILE_WEIGHTS or \
            -(-gh // round(one * Q_TILE_SHARE)) > MAX_TILE_ROWS, (name, lc.q_tiles, one)


@pytest.mark.parametrize("name, q_tiles", [("llama-1b", 8), ("small", 14), ("gemma-2b", 64), ("qwen2.5-1.5b", 30),
                                           ("llama-7b-32k", 10), ("mistral-7b", 10)])
def test_measured_defaults_stay(name, q_tiles):
    """The counts measured on the H100 (docs/performance.md, sessions 41 and 46): 8 on llama-1b against 6
    and 10 with its 12-stage ring, and llama-7b-32k keeping 10 (its 700 KiB tiles at 6 were 2% slower)."""
    assert resolve(PRESETS[name], ScheduleConfig()).q_tiles == q_tiles


@pytest.mark.parametrize("name", ["llama-1b", "llama-7b-32k", "small"])
def test_lowered_q_tiles_cover_each_group_once(name):
    """The lowered q tiles of each KV head cover its group's rows once, in even heights within 2."""
    cfg = PRESETS[name]
    sc = ScheduleConfig(capacity=256)
    lc, p = resolve(cfg, sc), lower(cfg, sc)
    gh = cfg.group * cfg.head_dim
    tiles = sorted((t.params["row0"], t.params["nrows"]) for t in p.tasks
                   if t.opcode == Op.RMS_LINEAR_ROPE and t.label.startswith("L0."))
    assert len(tiles) == cfg.n_kv_heads * lc.q_tiles
    assert [r0 for r0, _ in tiles] == [sum(n for _, n in tiles[:i]) for i in range(len(tiles))]
    assert sum(n for _, n in tiles) == cfg.n_kv_heads * gh
    heights = {n for _, n in tiles}
    assert all(n % 2 == 0 for n in heights) and max(heights) - min(heights) <= 2
