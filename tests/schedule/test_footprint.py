"""The checks made from a program's configs before anything is built (schedule/footprint.py)."""
import math

import pytest

from megavm.core.errors import UserError
from megavm.core.limits import MAX_K
from megavm.instructions.attention import combine_scratch
from megavm.schedule.config import ScheduleConfig, resolve
from megavm.schedule.footprint import require_attention_split
from megavm.schedule.models import PRESETS


@pytest.mark.parametrize("model, fuse_combine", [("tiny", False), ("llama-1b", False), ("llama-1b", True)])
def test_attention_split_refused_one_block_past_what_a_combine_holds(model, fuse_combine):
    """The largest capacity whose blocks one combine holds passes; one block more is refused in one
    line naming the capacity, the blocks and the most a combine holds (the validator would refuse the
    lowered program for the same reason, after lowering it)."""
    cfg = PRESETS[model]
    sc = ScheduleConfig(dtype="bf16", capacity=64, n_sms=132, kv_block=256, fuse_combine=fuse_combine)
    heads, room = (cfg.n_kv_heads, MAX_K - cfg.n_heads * cfg.head_dim) if fuse_combine else (1, MAX_K)
    most = max(n for n in range(1, MAX_K) if combine_scratch(heads, n, cfg.group) <= room)
    ok = ScheduleConfig(**{**sc.__dict__, "capacity": most * 256})
    require_attention_split(cfg, ok)
    assert math.ceil(resolve(cfg, ok).capacity / 256) == most
    with pytest.raises(UserError) as e:
        require_attention_split(cfg, ScheduleConfig(**{**sc.__dict__, "capacity": most * 256 + 1}))
    msg = str(e.value)
    assert "\n" not in msg and f"needs {most + 1} attention blocks of 256 keys" in msg and f"at most {most}" in msg
