"""A program that samples (ScheduleConfig.sample): SAMPLE's inputs checked on the host in one line,
and its tokens on ReferenceVM those of the sampling specification for the step's logits."""
from dataclasses import replace

import pytest
import torch

from megavm.core.errors import ConfigError, InputError
from megavm.instructions.sampling import sample_at
from megavm.schedule.config import ScheduleConfig
from megavm.schedule.lower import lower
from megavm.schedule.models import PRESETS
from megavm.vm.compile import compile
from megavm.vm.reference import ReferenceVM
from tests.programs import random_program_weights

SC = ScheduleConfig(dtype="f32", capacity=32, n_sms=4, sample=True)


def test_reference_tokens_follow_the_spec():
    packed = compile(PRESETS["tiny"], SC)
    vm = ReferenceVM(packed, random_program_weights(packed, gain=4.0))
    tok, seen = 3, set()
    for pos, (t, k, p, seed) in enumerate([(0.0, 0, 1.0, 1), (1.0, 0, 1.0, 2), (0.8, 8, 1.0, 3), (1.2, 20, 0.9, 4),
                                           (2.0, 32, 0.5, 5), (1.0, 1, 1.0, 6), (1.5, 0, 1.0, 7), (0.9, 5, 0.7, 8)]):
        out = vm.step({"token": tok, "pos": pos, "sampling": torch.tensor([t, k, p]), "seed": seed})
        want = sample_at(out["logits"], t, k, p, seed, pos)
        assert int(out["next_token"][0]) == want
        tok = want
        seen.add(tok)
    assert len(seen) > 3


@pytest.mark.parametrize("params, words", [
    ((-1.0, 0, 1.0), "temperature -1.0 must be finite and >= 0"),
    ((1.0, 33, 1.0), "top_k 33: the kernel samples among at most 32 candidates"),
    ((1.0, 0, 0.9), "top_p 0.9 with top_k 0"),
    ((1.0, 2.5, 1.0), "top_k 2.5 must be a whole number"),
    ((1.0, 4, 0.0), "top_p 0.0 must be in (0, 1]"),
])
def test_bad_sampling_inputs_are_one_line_and_change_nothing(params, words):
    packed = compile(PRESETS["tiny"], SC)
    vm = ReferenceVM(packed, random_program_weights(packed, gain=4.0))
    vm.step({"token": 1, "pos": 0, "sampling": torch.tensor([1.0, 4, 0.9]), "seed": 3})
    k0 = vm.buffer("k_cache.0").clone()
    with pytest.raises(InputError, match=r"^runtime input 'sampling': " + words.replace("(", r"\(").replace(")", r"\)")
                       .replace("[", r"\[").replace("]", r"\]")) as e:
        vm.step({"token": 1, "pos": 1, "sampling": torch.tensor(params), "seed": 3})
    assert "\n" not in str(e.value)
    assert torch.equal(vm.buffer("k_cache.0"), k0)
    with pytest.raises(InputError, match="seed"):
        vm.step({"token": 1, "pos": 1, "sampling": torch.tensor([1.0, 4, 0.9]), "seed": -2})


def test_sample_needs_the_tile_partials():
    with pytest.raises(ConfigError, match="sample needs fuse_argmax"):
        lower(PRESETS["tiny"], replace(SC, fuse_argmax=False))
