"""DLRM through the same IR, validator, packing and ReferenceVM as the decoders, against a plain torch
DLRM written from the model's definition (flywheel/dlrm_torch.py): probabilities within 1e-5
absolute (f32 sums in another order), for batch sizes 1 to 128, raw sparse ids far past the table
sizes (the hash wraps them), and a table of millions of rows that is gathered, never copied."""
import pytest
import torch

from megavm.core.errors import ConfigError, InputError
from megavm.flywheel.dlrm_torch import from_state
from megavm.schedule.dlrm import PRESETS, DLRMConfig, DLRMSchedule, pad_dense, program_weights, random_state
from megavm.vm.compile import compile
from megavm.vm.reference import ReferenceVM

TINY = PRESETS["dlrm-tiny"]
TOL = 1e-5


def _state(cfg: DLRMConfig, seed: int) -> dict:
    """The reference initialisation scaled up (MLPs x1.4, tables x2.8) so the probabilities spread over
    (0.01, 0.97) instead of clustering near 0.4, where a wrong layer could hide."""
    return {k: v * (2.8 if k.startswith("emb") else 1.4) for k, v in random_state(cfg, seed=seed).items()}


def _inputs(cfg: DLRMConfig, batch: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    dense = torch.rand(batch, cfg.dense, generator=g) * 4
    sparse = torch.randint(0, 1 << 31 - 1, (batch, cfg.n_sparse), generator=g, dtype=torch.int64).to(torch.int32)
    sparse[0] = 0                                   # row 1 of every table
    sparse[-1, 0] = torch.iinfo(torch.int32).max    # the largest id the input takes
    return dense, sparse


def _check(cfg, state, batch, dtype="f32", steps=2, **sched):
    vm = ReferenceVM(compile(cfg, DLRMSchedule(batch=batch, dtype=dtype, n_sms=6, **sched)),
                     program_weights(cfg, state, dtype), check=True)
    ref = from_state(cfg, {k: v.to({"f32": torch.float32, "bf16": torch.bfloat16}[dtype]) for k, v in state.items()})
    worst = 0.0
    for s in range(steps):                          # each step a new batch through the same program
        dense, sparse = _inputs(cfg, batch, seed=batch + s)
        got = vm.step({"dense": pad_dense(cfg, dense), "sparse": sparse})["prob"]
        with torch.no_grad():
            want = ref(dense, sparse)
        assert got.shape == want.shape == (batch, cfg.top[-1])
        err = (got - want).abs().max().item()
        assert err <= TOL, f"{batch=} {dtype=} step {s}: max |prob diff| {err:.2e} > {TOL}"
        worst = max(worst, err)
    return worst


@pytest.mark.parametrize("batch", [1, 2, 7, 32, 128])
def test_tiny_matches_torch(batch):
    _check(TINY, _state(TINY, 1), batch)


def test_bf16_weights_and_tiles():
    """bf16 weights (the torch model runs the same bf16 values in f32), odd batch and row tiles."""
    _check(TINY, _state(TINY, 2), 13, dtype="bf16", batch_tile=5, rows=8)


def test_every_layer_shape_padded():
    """Widths that are not multiples of 8 anywhere: the dense input, hidden layers, the interaction."""
    cfg = DLRMConfig(dense=5, bottom=(19, 11, 6), tables=(3, 50, 9, 2, 77), top=(13, 3))
    _check(cfg, _state(cfg, 3), 9, batch_tile=4)


def test_table_of_millions_of_rows_is_gathered_not_copied():
    cfg = DLRMConfig(dense=13, bottom=(16, 8), tables=(4_000_000, 5), top=(8, 1))
    state = random_state(cfg, seed=4)                # 4M x 8 f32: 128 MB, held once
    w = program_weights(cfg, state)
    assert w["emb_l.0.weight"].data_ptr() == state["emb_l.0.weight"].data_ptr(), "the table was copied"
    vm = ReferenceVM(compile(cfg, DLRMSchedule(batch=4, n_sms=4)), w)
    assert vm.buffer("emb_l.0.weight").data_ptr() == state["emb_l.0.weight"].data_ptr(), "the VM copied the table"
    dense, sparse = _inputs(cfg, 4, seed=5)
    sparse[1, 0] = 3_999_998                        # the table's last row
    got = vm.step({"dense": pad_dense(cfg, dense), "sparse": sparse})["prob"]
    with torch.no_grad():
        want = from_state(cfg, state)(dense, sparse)
    assert (got - want).abs().max().item() <= TOL


def test_bad_inputs_and_configs_are_named():
    vm = ReferenceVM(compile(TINY, DLRMSchedule(batch=3, n_sms=2)), program_weights(TINY, random_state(TINY)))
    dense, sparse = _inputs(TINY, 3, seed=0)
    before = {n: vm.buffer(n).clone() for n in ("prob", "inter")}
    bad = sparse.clone()
    bad[2, 1] = -4
    for inputs, words in (({"dense": pad_dense(TINY, dense), "sparse": bad}, "sparse id -4 at [2, 1] of input 'sparse'"),
                          ({"dense": pad_dense(TINY, dense), "sparse": sparse.float()}, "must hold integers"),
                          ({"dense": dense, "sparse": sparse}, "'dense' has shape (3, 13), the program expects (3, 16)"),
                          ({"dense": pad_dense(TINY, dense)}, "missing runtime inputs ['sparse']")):
        with pytest.raises(InputError, match=words.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")):
            vm.step(inputs)
    assert all(torch.equal(vm.buffer(n), t) for n, t in before.items()), "a refused step changed the VM's buffers"
    with pytest.raises(InputError, match=r"dense features have shape \(3, 12\), expected \(batch, 13\)"):
        pad_dense(TINY, dense[:, :12])
    for kw, words in ((dict(bottom=(8, 0)), "bottom=(8, 0) must be one or more positive integers"),
                      (dict(tables=()), "tables=() must be"), (dict(top=(2.5,)), "top=(2.5,)")):
        with pytest.raises(ConfigError, match=words.replace("(", r"\(").replace(")", r"\)")):
            DLRMConfig(**kw)
    with pytest.raises(ConfigError, match=r"batch=0 must be in \[1, 4096\]"):
        compile(TINY, DLRMSchedule(batch=0))
    state = random_state(TINY)
    state["top_l.0.weight"] = state["top_l.0.weight"][:, :-1]
    with pytest.raises(ConfigError, match="top_l.0.weight' has shape"):
        program_weights(TINY, state)
