"""Every model family megavm lowers, against transformers' own model classes (which nobody here wrote):
random-weight checkpoints built and saved by transformers (tests/hf_families.py), decoded by
`megavm run --checkpoint DIR --out FILE` on the CPU (ReferenceVM, itself checked against megavm's eager
model), and compared step by step with the transformers model's forward over the same tokens. Tokens
must be identical; logits within 1e-5 of the step's max |logit| (f32 weights, so summation order is the
only difference: measured 4e-7 to 1.3e-6).
"""
import pytest

pytest.importorskip("transformers")
pytest.importorskip("safetensors")

from megavm import cli  # noqa: E402
from megavm.schedule.checkpoint import load  # noqa: E402
from tests.hf_families import BF16_CASES, BF16_TOL, CASES, check_decode, run_args, save, save_bf16  # noqa: E402

TOL = 1e-5


@pytest.mark.parametrize("name", sorted(CASES))
def test_megavm_run_matches_transformers(name, tmp_path):
    m = save(name, tmp_path / "ckpt")
    ck = load(tmp_path / "ckpt")
    assert ck.dtype == "f32" and ck.cfg.family == CASES[name][0], (ck.cfg, ck.dtype)
    out = tmp_path / "decode.npz"
    assert cli.main(run_args(tmp_path / "ckpt", out, "cpu")) == 0, f"{name}: megavm run failed its own checks"
    check_decode(name, m, out, TOL)


@pytest.mark.parametrize("name", sorted(BF16_CASES))
def test_bf16_checkpoint_matches_transformers(name, tmp_path):
    """bf16 checkpoints (tests/hf_families.py: BF16_CASES) on the CPU against transformers' forward of the
    same bf16 weights (BF16_TOL); the megakernel's twin runs in tests/gpu."""
    m = save_bf16(name, tmp_path / "ckpt")
    assert load(tmp_path / "ckpt").dtype == "bf16"
    out = tmp_path / "decode.npz"
    assert cli.main(run_args(tmp_path / "ckpt", out, "cpu")) == 0
    check_decode(f"{name} bf16", m, out, BF16_TOL)
