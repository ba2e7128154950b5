"""`megavm run --checkpoint DIR --adapter A1 --adapter A2 --adapter-id N` against peft (which nobody here
wrote): random-weight checkpoints saved by transformers (tests/hf_families.py), LoRA adapters made and
saved by peft, and the peft model's forward with that adapter active (unmerged, and merged into the
weights) over the same tokens. Tokens identical; logits within 1e-5 of the step's max |logit| (f32)."""
import pytest

pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

import torch  # noqa: E402

from megavm import cli  # noqa: E402
from tests.hf_families import check_decode, model, run_args  # noqa: E402

TOL = 1e-5
ADAPTERS = {"a1": dict(r=4, lora_alpha=8, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]),
            "a2": dict(r=8, lora_alpha=4, use_rslora=True, target_modules=["v_proj", "gate_proj", "up_proj", "down_proj"])}


def make_adapter(base, name: str, path, seed: int):
    """A peft LoRA adapter on a copy of base, its A and B drawn so the low-rank term is O(1)."""
    import copy
    pm = peft.get_peft_model(copy.deepcopy(base), peft.LoraConfig(init_lora_weights=False, **ADAPTERS[name]))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, w in pm.named_parameters():
            if "lora_A" in n:
                w.copy_(torch.randn(w.shape, generator=g) / w.shape[1] ** 0.5)
            elif "lora_B" in n:
                w.copy_(0.5 * torch.randn(w.shape, generator=g) / w.shape[1] ** 0.5)
    pm.save_pretrained(path)


@pytest.mark.parametrize("family", ["llama-untied", "qwen2-bias", "gemma"])
def test_megavm_run_with_adapters_matches_peft(family, tmp_path):
    check_run_with_adapters(family, tmp_path, "cpu", TOL)


def check_run_with_adapters(family: str, tmp_path, device: str, tol: float) -> None:
    """Two adapters loaded at once; ids 1, 2 and 0 each against peft with that adapter (or none)."""
    base = model(family)
    base.save_pretrained(tmp_path / "ckpt", safe_serialization=True)
    for i, name in enumerate(ADAPTERS):
        make_adapter(base, name, tmp_path / name, seed=i)
    args = run_args(tmp_path / "ckpt", tmp_path / "x.npz", device) + ["--adapter", str(tmp_path / "a1"),
                                                                    "--adapter", str(tmp_path / "a2")]
    theirs = peft.PeftModel.from_pretrained(base, tmp_path / "a1", adapter_name="a1").eval()
    theirs.load_adapter(tmp_path / "a2", adapter_name="a2")
    for aid, name in ((1, "a1"), (2, "a2")):
        out = tmp_path / f"{name}.npz"
        args[args.index("--out") + 1] = str(out)
        assert cli.main(args + ["--adapter-id", str(aid)]) == 0, f"{family} {name}: megavm run failed its own checks"
        theirs.set_adapter(name)
        check_decode(f"{family} {name} (peft, unmerged)", theirs, out, tol)
        import copy
        merged = copy.deepcopy(theirs).merge_and_unload()
        check_decode(f"{family} {name} (peft, merged)", merged, out, tol)
    out = tmp_path / "none.npz"
    args[args.index("--out") + 1] = str(out)
    assert cli.main(args + ["--adapter-id", "0"]) == 0
    with theirs.disable_adapter():
        check_decode(f"{family} no adapter", theirs, out, tol)
