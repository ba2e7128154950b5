"""The IR's JSON form: exact round trip, versioned, refused when malformed, never executed."""
import json

import pytest

from megavm.schedule.config import ScheduleConfig
from megavm.schedule.ir import IR_VERSION, Program
from megavm.schedule.lower import lower
from megavm.schedule.models import PRESETS


@pytest.fixture(scope="module")
def tiny():
    return lower(PRESETS["tiny"], ScheduleConfig(dtype="f32", capacity=64, n_sms=8))


def test_round_trip_is_exact(tiny, tmp_path):
    back = Program.from_json(tiny.to_json())
    assert back.buffers == tiny.buffers
    assert back.counters == tiny.counters
    assert back.meta == json.loads(json.dumps(tiny.meta))
    assert len(back.tasks) == len(tiny.tasks)
    for i, (a, b) in enumerate(zip(back.tasks, tiny.tasks)):
        assert a == b, f"task {i} ({b.label}) changed in the round trip: {a} != {b}"
    assert back.to_json() == tiny.to_json()
    path = tmp_path / "tiny.json"
    tiny.save(path)
    assert Program.load(path).to_json() == tiny.to_json()


def test_round_trip_keeps_float_params_bitwise(tiny):
    back = Program.from_json(tiny.to_json())
    for a, b in zip(back.tasks, tiny.tasks):
        for k, v in b.params.items():
            assert type(a.params[k]) is type(v) and a.params[k] == v, f"{b.label}: param {k}={v!r} -> {a.params[k]!r}"


def test_unknown_version_rejected_with_clear_message(tiny):
    d = json.loads(tiny.to_json())
    d["megavm_ir"] = IR_VERSION + 1
    with pytest.raises(ValueError, match=f"unsupported megavm IR version {IR_VERSION + 1}.*reads version {IR_VERSION}"):
        Program.from_json(json.dumps(d))


@pytest.mark.parametrize("text, message", [
    ("", "not a megavm program"),
    ("{not json", "not a megavm program"),
    ("[1, 2, 3]", "missing 'megavm_ir'"),
    ('{"buffers": []}', "missing 'megavm_ir'"),
])
def test_not_a_program_rejected(text, message):
    with pytest.raises(ValueError, match=message):
        Program.from_json(text)


def _mutations():
    yield "no tasks key", lambda d: d.pop("tasks")
    yield "unknown buffer kind", lambda d: d["buffers"][0].__setitem__(1, "SCRATCH")
    yield "unknown dtype", lambda d: d["buffers"][0].__setitem__(2, "F64")
    yield "buffer row too short", lambda d: d["buffers"][0].pop()
    yield "task without op", lambda d: d["tasks"][0].pop("op")
    yield "wait not a pair", lambda d: d["tasks"][-1].__setitem__("waits", [[1]])
    yield "input id not a number", lambda d: d["tasks"][0].__setitem__("in", ["tok_emb"])
    yield "params not a dict", lambda d: d["tasks"][0].__setitem__("params", [1, 2])
    yield "param not a number", lambda d: d["tasks"][0]["params"].__setitem__("col0", "0")
    yield "meta not a dict", lambda d: d.__setitem__("meta", 7)


@pytest.mark.parametrize("what, mutate", list(_mutations()), ids=[w for w, _ in _mutations()])
def test_malformed_rejected(tiny, what, mutate):
    d = json.loads(tiny.to_json())
    mutate(d)
    with pytest.raises(ValueError, match="malformed megavm program"):
        Program.from_json(json.dumps(d))


def test_loading_executes_nothing(tiny, tmp_path):
    marker = tmp_path / "pwned"
    payload = f"__import__('os').system('touch {marker}')"
    d = json.loads(tiny.to_json())
    d["buffers"][0][0] = payload
    d["tasks"][0]["label"] = payload
    d["meta"]["note"] = {"__reduce__": payload}
    back = Program.from_json(json.dumps(d))
    assert not marker.exists()
    assert back.buffers[0].name == payload and back.tasks[0].label == payload
    assert back.meta["note"] == {"__reduce__": payload}
