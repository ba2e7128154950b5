"""Every model family through `megavm run --checkpoint DIR --device cuda --out FILE` (the megakernel,
checked by the CLI against ReferenceVM and the eager model on the GPU), against the transformers
model's forward on the CPU. Tolerance 2e-5 of each step's max |logit|: the megakernel is held within
1e-5 of ReferenceVM in f32 (test_megakernel.py) and ReferenceVM within 1e-5 of transformers
(tests/schedule/test_families.py), so the two add. Tokens identical."""
import pytest

pytest.importorskip("transformers")
pytest.importorskip("safetensors")

from megavm import cli  # noqa: E402
from tests.hf_families import BF16_CASES, BF16_TOL, CASES, check_decode, run_args, save, save_bf16  # noqa: E402

pytestmark = pytest.mark.cuda
TOL = 2e-5


@pytest.mark.parametrize("name", sorted(CASES))
def test_megakernel_run_matches_transformers(name, tmp_path):
    m = save(name, tmp_path / "ckpt")
    out = tmp_path / "decode.npz"
    assert cli.main(run_args(tmp_path / "ckpt", out, "cuda")) == 0, f"{name}: megavm run failed its own checks"
    check_decode(name, m, out, TOL)


@pytest.mark.parametrize("name", sorted(BF16_CASES))
def test_tensor_core_attention_matches_transformers(name, tmp_path):
    """bf16 checkpoints whose attention takes the partial's tensor-core path (docs/attention.md: head_dim
    64 with groups of 4, head_dim 256 with a group of 8), one of them a Qwen3-MoE whose bf16 experts take
    EXPERT_DOWN's pairs loop, held to transformers' forward of the same bf16 weights (BF16_TOL)."""
    m = save_bf16(name, tmp_path / "ckpt")
    out = tmp_path / "decode.npz"
    assert cli.main(run_args(tmp_path / "ckpt", out, "cuda")) == 0, "megavm run failed its own checks"
    check_decode(f"{name} bf16", m, out, BF16_TOL)
