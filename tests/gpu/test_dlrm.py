"""DLRM in the megakernel against the plain torch DLRM on the GPU (tests/schedule/test_dlrm.py holds
ReferenceVM to the same): probabilities within 1e-5 absolute, batch sizes 1 to 128, and the Criteo
Kaggle shape (26 tables, 33.8M rows) in bf16, its rows gathered where they lie."""
import pytest
import torch

from megavm.flywheel.dlrm_torch import from_state
from megavm.schedule.dlrm import PRESETS, DLRMSchedule, pad_dense, program_weights, random_state
from megavm.vm.compile import compile
from megavm.vm.megakernel import MegakernelVM
from tests.schedule.test_dlrm import TOL, _inputs, _state

pytestmark = pytest.mark.cuda


def _check(cfg, state, batch, dtype, steps=3, **sched):
    n_sms = torch.cuda.get_device_properties(0).multi_processor_count
    vm = MegakernelVM(compile(cfg, DLRMSchedule(batch=batch, dtype=dtype, n_sms=n_sms, **sched)),
                      program_weights(cfg, state, dtype))
    ref = from_state(cfg, state, "cuda")
    for s in range(steps):
        dense, sparse = _inputs(cfg, batch, seed=batch + s)
        got = vm.run({"dense": pad_dense(cfg, dense), "sparse": sparse}).outputs()["prob"]
        with torch.no_grad():
            want = ref(dense.cuda(), sparse.cuda())
        err = (got - want).abs().max().item()
        assert err <= TOL, f"{batch=} {dtype=} step {s}: max |prob diff| {err:.2e} > {TOL}"


@pytest.mark.parametrize("batch", [1, 2, 7, 32, 128])
@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_tiny_matches_torch(batch, dtype):
    cfg = PRESETS["dlrm-tiny"]
    state = {k: v.to(torch.bfloat16).float() if dtype == "bf16" else v for k, v in _state(cfg, 1).items()}
    _check(cfg, {k: v.cuda() for k, v in state.items()}, batch, dtype)


@pytest.mark.parametrize("batch", [1, 128])
def test_kaggle_shape_matches_torch(batch):
    cfg = PRESETS["dlrm-kaggle"]
    state = {k: v.float() for k, v in random_state(cfg, torch.bfloat16, seed=0, device="cuda").items()}
    _check(cfg, state, batch, "bf16", steps=2)
