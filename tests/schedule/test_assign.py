"""SM assignment: every task in exactly one queue, each queue in program order, any SM count."""
import pytest

from megavm.instructions import Op
from megavm.schedule.assign import STRATEGIES, assign, crowded_partials, predicted_ns
from megavm.schedule.config import ScheduleConfig
from megavm.schedule.lower import lower
from megavm.schedule.models import PRESETS
from megavm.schedule.validate import validate


@pytest.fixture(scope="module")
def llama1b():
    return lower(PRESETS["llama-1b"], ScheduleConfig(dtype="bf16", capacity=512, n_sms=132))


@pytest.mark.parametrize("strategy", sorted(STRATEGIES))
@pytest.mark.parametrize("n_sms", [132, 114, 7])
def test_every_task_once_in_program_order(llama1b, strategy, n_sms):
    queues = assign(llama1b, n_sms, strategy)
    n = len(llama1b.tasks)
    assert len(queues) == n_sms, f"{strategy=}, {n_sms=}: {len(queues)} queues"
    flat = sorted(i for q in queues for i in q)
    assert flat == list(range(n)), f"{strategy=}, {n_sms=}: {len(flat)} entries for {n} tasks, or duplicates"
    for s, q in enumerate(queues):
        assert all(a < b for a, b in zip(q, q[1:])), f"{strategy=}, {n_sms=}: queue {s} leaves program order"
    empty = [s for s, q in enumerate(queues) if not q]
    assert not empty, f"{strategy=}, {n_sms=}: idle SMs {empty[:5]} with {n} tasks to place"


@pytest.mark.parametrize("strategy", sorted(STRATEGIES))
@pytest.mark.parametrize("n_sms", [1, 3, 16])
def test_queues_pass_the_validator(strategy, n_sms):
    p = lower(PRESETS["tiny"], ScheduleConfig(dtype="f32", capacity=64, n_sms=n_sms))
    report = validate(p, assign(p, n_sms, strategy))
    assert report.ok, f"{strategy=}, {n_sms=}:\n{report}"


@pytest.mark.parametrize("n_sms", [132, 114, 7])
def test_balanced_never_predicted_slower_than_round_robin(llama1b, n_sms):
    """Greedy list scheduling carries no guarantee against another order (on the default llama-1b program at
    7 SMs it predicts 0.03% more), but it must not fall behind round robin by more than that kind of margin."""
    bal = predicted_ns(llama1b, assign(llama1b, n_sms, "balanced"))
    rr = predicted_ns(llama1b, assign(llama1b, n_sms, "round_robin"))
    assert 0 < bal <= rr * 1.001, f"{n_sms=}: balanced {bal / 1e3:.1f} us vs round_robin {rr / 1e3:.1f} us"


def test_bad_arguments_refused(llama1b):
    with pytest.raises(ValueError, match="n_sms=0 must be >= 1"):
        assign(llama1b, 0)
    with pytest.raises(ValueError, match="unknown assignment strategy 'fastest'"):
        assign(llama1b, 8, "fastest")


@pytest.mark.parametrize("q_tiles, crowded", [(10, True), (8, True), (5, False)])
def test_crowded_partials_follow_the_layer_task_count(q_tiles, crowded):
    """llama-1b at capacity 288 in blocks (attn_direct=False: 5 partials a KV head, 40 a layer) on 132
    queues: with 10 q tiles a KV head (and 3 k, 3 v) a layer's q/k/v tiles and partials are 168 tasks,
    more than the queues, so round robin puts some partials right behind q/k/v tiles of their own layer
    in every layer; with 5 they are 128 and none is."""
    p = lower(PRESETS["llama-1b"], ScheduleConfig(capacity=288, n_sms=132, q_tiles=q_tiles, attn_direct=False))
    queues = assign(p, 132, "round_robin")
    n, layers = crowded_partials(p, queues)
    assert (n > 0 and layers == 16) if crowded else (n, layers) == (0, 0), (q_tiles, n, layers)
    # the count is what the queues hold: every partial it counts sits right behind a task of its own layer
    # that is no partial or combine
    behind = sum(1 for q in queues for a, b in zip(q, q[1:]) if p.tasks[b].opcode == Op.ATTN_PARTIAL
                 and p.tasks[a].opcode in (Op.RMS_LINEAR_ROPE, Op.RMS_LINEAR_KV)
                 and p.tasks[a].label.split(".")[0] == p.tasks[b].label.split(".")[0])
    assert behind == n


def test_crowded_partials_none_on_one_queue_each():
    """One queue per task: no partial is behind anything."""
    p = lower(PRESETS["tiny"], ScheduleConfig(dtype="f32", capacity=64, n_sms=8))
    assert crowded_partials(p, [[i] for i in range(len(p.tasks)) if not p.tasks[i].inline]) == (0, 0)
