"""Every model family through `megavm run --checkpoint DIR --device cuda --out FILE` (the megakernel,
checked by the CLI against ReferenceVM and the eager model on the GPU), against the transformers
model's forward on the CPU. Tolerance 2e-5 of each step's max |logit|: the megakernel is held within
1e-5 of ReferenceVM in f32 (test_megakernel.py) and ReferenceVM within 1e-5 of transformers
(tests/schedule/test_families.py), so the two add. Tokens identical."""
import pytest

pytest.importorskip("transformers")
pytest.importorskip("safetensors")

from megavm import cli  # noqa: E402
from tests.hf_families import BF16_TOL, CASES, check_decode, run_args, save, save_bf16  # noqa: E402

pytestmark = pytest.mark.cuda
TOL = 2e-5


@pytest.mark.parametrize("name", sorted(CASES))
def test_megakernel_run_matches_transformers(name, tmp_path):
    m = save(name, tmp_path / "ckpt")
    out = tmp_path / "decode.npz"
    assert cli.main(run_args(tmp_path / "ckpt", out, "cuda")) == 0, f"{name}: megavm run failed its own checks"
    check_decode(name, m, out, TOL)


def test_tensor_core_attention_matches_transformers(tmp_path):
    """A bf16 Llama checkpoint with head_dim 64 and groups of 4 takes the attention partial's tensor-core
    path (docs/attention.md): held to transformers' forward of the same bf16 weights (BF16_TOL)."""
    m = save_bf16(tmp_path / "ckpt")
    out = tmp_path / "decode.npz"
    assert cli.main(run_args(tmp_path / "ckpt", out, "cuda")) == 0, "megavm run failed its own checks"
    check_decode("llama bf16", m, out, BF16_TOL)
