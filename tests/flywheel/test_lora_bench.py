"""lora_bench's command line: its --switch takes ScheduleConfig fields and names what it refuses, before any
GPU work."""
import pytest

from megavm.flywheel import lora_bench


@pytest.mark.parametrize("arg, words", [("nope=1", "not FIELD=VALUE of a ScheduleConfig field"),
                                        ("MVM_STAGES=8", "build knobs need kernel_time")])
def test_bad_switches_are_refused_by_name(arg, words, capsys):
    with pytest.raises(SystemExit) as e:
        lora_bench.main(["--switch", arg])
    assert e.value.code == 2 and words in capsys.readouterr().err
