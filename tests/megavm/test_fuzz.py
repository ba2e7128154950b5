"""The mutation fuzzer: nothing the validator accepts deadlocks or races in the ReferenceVM, and the
VM oracle it relies on does catch a deadlock and a race."""
import random
from dataclasses import replace

from megavm.fuzz import (
    MUTATIONS,
    Node,
    back_edge,
    fuzz,
    random_program,
    random_queues,
    random_weights,
    run_checked,
    shuffled,
    small_program,
)
from megavm.schedule.validate import validate

# kinds whose every mutant is invalid by construction (a dropped wait may be implied by another)
ALWAYS_INVALID = set(MUTATIONS) - {"drop_wait"}


def test_fuzz_accepts_nothing_unsafe():
    n = 20 * len(MUTATIONS) + 20                 # at least 20 mutants of each kind
    r = fuzz(n, seed=0)
    assert r.made == n and r.rejected + r.accepted == r.made, str(r)
    assert r.unsafe_accepted == 0, str(r)
    for kind, counts in r.by_kind.items():
        assert counts["made"] >= 20, f"{kind}: {counts}"
        if kind in ALWAYS_INVALID:
            assert counts["rejected"] == counts["made"], f"{kind}: {counts}"


def test_fuzz_is_deterministic():
    a, b = fuzz(16, seed=3), fuzz(16, seed=3)
    assert (a.made, a.rejected, a.by_kind) == (b.made, b.rejected, b.by_kind)


def test_random_programs_run_clean():
    rng = random.Random(5)
    for k in range(5):
        p = random_program(rng)
        q = random_queues(p, 3, rng)
        assert validate(p, q).ok
        assert run_checked(p, q, random_weights(p, k), rng) is None


def chain():
    return small_program(8, 8, [Node((0,), 16, 8)])


def test_oracle_catches_deadlock():
    rng = random.Random(0)
    p = chain()
    q = [list(range(len(p.tasks)))]
    m, mq, what = back_edge(p, q, rng)
    assert not validate(m, mq).ok
    err = run_checked(m, mq, random_weights(p, 0), rng)
    assert err is not None and err.startswith("DeadlockError"), f"{what}: {err}"


def test_oracle_catches_race():
    """Task 2 reads x.0 without waiting for the embedding, and its queue runs it first."""
    p = chain()
    tasks = list(p.tasks)
    tasks[2] = replace(tasks[2], waits=())
    m = replace(p, tasks=tasks)
    q = [[2, 0, 1]]
    assert "read_after_write" in {x.rule for x in validate(m, q).problems}
    err = run_checked(m, q, random_weights(p, 0), random.Random(0))
    assert err is not None and err.startswith("RaceError"), err


def test_shuffled_keeps_programs_valid():
    rng = random.Random(1)
    p = small_program(16, 5, [Node((0,), 8, 3), Node((0,), 16, 7), Node((1, 2), 0, 4)])
    for _ in range(10):
        s = shuffled(p, rng)
        assert sorted(t.label for t in s.tasks) == sorted(t.label for t in p.tasks)
        assert validate(s, random_queues(s, 2, rng)).ok


def test_queue_before_producer_passes_over_inline_producers():
    """An inline task sits in no queue, so it is never the producer a mutant is queued ahead of (seed 3 of
    `megavm fuzz --programs 600` once stopped on one with an internal error)."""
    from megavm.fuzz import queue_before_producer
    from megavm.schedule.assign import assign
    from megavm.schedule.config import ScheduleConfig
    from megavm.schedule.lower import lower
    from megavm.schedule.models import PRESETS
    p = lower(PRESETS["tiny"], ScheduleConfig(dtype="f32", capacity=32, n_sms=4, inline_combine=True))
    q = assign(p, 4, "balanced")
    assert any(t.inline for t in p.tasks)
    before = {t for queue in q for t in queue}
    for seed in range(200):
        _, queues, what = queue_before_producer(p, q, random.Random(seed))
        after = {t for queue in queues for t in queue}
        assert before <= after and len(after - before) <= 1, what      # at most the moved task joins a queue
    r = fuzz(600, seed=3)
    assert r.made == 600 and r.unsafe_accepted == 0, str(r)
