"""The megavm command line, end to end, and a Hugging Face checkpoint checked against transformers."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from megavm import cli

ROOT = Path(__file__).resolve().parents[2]


def megavm(*args, timeout=300):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "megavm", *map(str, args)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


def verdict(r):
    lines = r.stdout.strip().splitlines()
    return lines[-1] if lines else ""


def test_run_tiny_passes():
    r = megavm("run", "--model", "tiny", "--tokens", 32)
    assert r.returncode == 0 and verdict(r).startswith("PASS"), r.stdout + r.stderr
    tokens = next(l for l in r.stdout.splitlines() if l.startswith("prompt [1] -> 32 tokens:"))
    assert len(tokens.split(":")[1].split()) == 32, tokens
    assert "ms/token" in r.stdout and "max |logit diff| / max |logit|" in verdict(r) and "tol 1e-05" in verdict(r)


def test_run_bf16_under_seeded_interleavings(capsys):
    assert cli.main(["run", "--dtype", "bf16", "--tokens", "6", "--prompt", "7,8,9", "--seeds", "2", "--sms", "5",
                     "--strategy", "balanced"]) == 0
    out = capsys.readouterr().out
    assert out.strip().splitlines()[-1].startswith("PASS"), out
    assert "reference-vm seed 1 (checking mode) vs eager: tokens identical" in out
    assert "max |logit diff| / max |logit|" in out and "(tol 2e-03)" in out


def test_run_fails_on_a_logit_mismatch(monkeypatch, capsys):
    """A VM whose logits are off by 1e-3 (far past the f32 tolerance of 1e-5 of the logits' scale) must
    give FAIL and exit 1."""
    import megavm.vm.verify as verify
    real = verify.reference_step

    def skewed(vm, extra=None):
        step = real(vm, extra)
        return lambda tok, pos: (lambda lg, nxt: (lg + 1e-3, nxt))(*step(tok, pos))
    monkeypatch.setattr(verify, "reference_step", skewed)
    assert cli.main(["run", "--tokens", "4"]) == 1
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith("FAIL max |logit diff| / max |logit|"), last
    err = float(last.split("|logit| ")[1].split()[0])
    assert err > 1e-5, last


def test_sampled_run_passes_and_repeats_with_its_seed(capsys):
    """megavm run --temperature on a mixture of experts: the VM's sampled tokens are the sampling spec's
    on its own logits, the eager model fed the same tokens agrees on the logits, and the same seed gives
    the same tokens."""
    args = ["run", "--model", "moe-tiny", "--tokens", "10", "--temperature", "0.9", "--top-k", "8", "--top-p", "0.95"]
    runs = []
    for seed in ("5", "5", "6"):
        assert cli.main(args + ["--seed", seed]) == 0
        out = capsys.readouterr().out
        assert "tokens vs the sampling spec on its logits: tokens identical" in out, out
        assert out.strip().splitlines()[-1].startswith("PASS"), out
        runs.append(next(line for line in out.splitlines() if line.startswith("prompt ")))
    assert runs[0] == runs[1] != runs[2]


@pytest.mark.parametrize("args, message", [
    (["--temperature", "-1"], "sampling: temperature -1.0 must be finite and >= 0"),
    (["--temperature", "1", "--top-k", "64"], "sampling: top_k 64: the kernel samples among at most 32 candidates"),
    (["--temperature", "1", "--top-p", "0.5"], "sampling: top_p 0.5 with top_k 0"),
    (["--seed", "3"], "--top-k, --top-p and --seed take effect with --temperature"),
    (["--prompt", "1,999"], "token ids [999] are outside the vocabulary [0, 256)"),
    (["--prompt", "1,x"], "expected comma-separated token ids"),
    (["--tokens", "40", "--capacity", "16"], "--capacity 16 is below the 40 positions"),
    (["--checkpoint", "/nonexistent/megavm"], "no config.json"),
])
def test_usage_errors_exit_2(capsys, args, message):
    assert cli.main(["run", *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("megavm run: error:") and message in err, err


def test_unsupported_checkpoint_is_one_line(tmp_path):
    """A config megavm cannot lower: exit 2, one line naming the file and the field, no traceback."""
    import json
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"],
                                                      "hidden_size": 64, "num_hidden_layers": 2}))
    for cmd in ("run", "validate"):
        r = megavm(cmd, "--checkpoint", tmp_path)
        err = r.stderr.strip().splitlines()
        assert r.returncode == 2 and len(err) == 1 and r.stdout == "", f"{cmd}: {r.returncode=}\n{r.stdout}{r.stderr}"
        assert "config.json: model_type='gpt2'" in err[0] and "is not supported" in err[0], err


def test_validate_tiny():
    r = megavm("validate", "--model", "tiny")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "program valid" in r.stdout and "tasks" in r.stdout and "validation took" in r.stdout, r.stdout


def test_validate_exits_1_on_an_invalid_program(monkeypatch, capsys):
    import megavm.schedule.plan as plan
    real = plan.lower

    def dropped_wait(*a, **k):
        p = real(*a, **k)
        p.tasks[-1].waits = ()
        return p
    monkeypatch.setattr(plan, "lower", dropped_wait)
    assert cli.main(["validate", "--model", "tiny", "--sms", "4"]) == 1
    assert "program invalid" in capsys.readouterr().out


def test_info_and_fuzz(capsys):
    assert cli.main(["info"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in ("tiny", "small", "llama-1b", "llama-7b-32k")), out
    assert cli.main(["fuzz", "--programs", "8", "--seed", "3"]) == 0
    out = capsys.readouterr().out
    assert "made 8," in out and "unsafe accepted 0" in out and out.strip().endswith("PASS no unsafe program accepted")


def test_console_script_installed():
    exe = shutil.which("megavm")
    if exe is None:
        pytest.skip("the megavm console script is not installed (pip install -e .)")
    r = subprocess.run([exe, "info"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "llama-1b" in r.stdout, r.stdout + r.stderr


def test_commands_table_drives_the_parser():
    p = cli.parser()
    sub = next(a for a in p._actions if a.dest == "command")
    assert sorted(sub.choices) == sorted(cli.COMMANDS)


# -- a Hugging Face checkpoint, checked against transformers itself -----------------------------------
def hf_checkpoint(path, tied, seed=0, **config):
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("safetensors")
    cfg = transformers.LlamaConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                   intermediate_size=96, vocab_size=256, rope_theta=25000.0, rms_norm_eps=1e-5,
                                   tie_word_embeddings=tied, torch_dtype="float32", **config)
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(cfg).float().eval()
    with torch.no_grad():   # O(1) logits, so that 1e-4 means something (the default init gives ~1e-3)
        for name, w in model.named_parameters():
            w.copy_(1 + 0.1 * torch.randn_like(w) if w.ndim == 1 else torch.randn_like(w) / w.shape[1] ** 0.5)
    model.save_pretrained(path, safe_serialization=True)
    return model


def test_run_checkpoint_passes(tmp_path):
    hf_checkpoint(tmp_path, tied=False)
    r = megavm("run", "--checkpoint", tmp_path, "--tokens", 8, "--prompt", "5,6")
    assert r.returncode == 0 and verdict(r).startswith("PASS"), r.stdout + r.stderr
    assert "vocab 256, f32" in r.stdout
    r = megavm("validate", "--checkpoint", tmp_path)
    assert r.returncode == 0 and "vocab 256, f32" in r.stdout and "program valid" in r.stdout, r.stdout + r.stderr


def test_run_with_an_fp8_kv_cache(tmp_path, capsys):
    """--kv-cache fp8 on a checkpoint: the program appends K and V by amax -> quantize tasks and the run
    holds ReferenceVM to the eager model of that cache (f32 tolerance); its logits are 1e-3 or more
    away from the same run's without the flag, so the flag is not ignored; an unknown format is a usage
    error."""
    hf_checkpoint(tmp_path, tied=False)
    logits = []
    for flag in (["--kv-cache", "fp8"], []):
        out = tmp_path / f"run{len(flag)}.npz"
        assert cli.main(["run", "--checkpoint", str(tmp_path), "--tokens", "8", "--prompt", "5,6", "--seeds", "1",
                         "--device", "cpu", "--out", str(out), *flag]) == 0
        printed = capsys.readouterr().out
        assert printed.strip().splitlines()[-1].startswith("PASS") and "(tol 1e-05)" in printed, printed
        logits.append(torch.from_numpy(np.load(out)["logits"]))
    assert ((logits[0] - logits[1]).abs().max() / logits[1].abs().max()).item() >= 1e-3
    assert cli.main(["run", "--kv-cache", "int8"]) == 2
    assert "--kv-cache: invalid choice: 'int8'" in capsys.readouterr().err


def test_run_with_an_nvfp4_kv_cache(tmp_path, capsys):
    """--kv-cache nvfp4 on a checkpoint of head_dim 32: ReferenceVM held to the eager model of that cache
    (f32 tolerance); its logits are 1e-3 or more away from the same run's with an fp8 cache and without
    the flag, so the flag is not ignored; head_dim 16 is a usage error naming the setting."""
    hf_checkpoint(tmp_path, tied=False, head_dim=32)
    logits = {}
    for kv in ("nvfp4", "fp8", ""):
        out = tmp_path / f"run-{kv}.npz"
        assert cli.main(["run", "--checkpoint", str(tmp_path), "--tokens", "8", "--prompt", "5,6", "--seeds", "1",
                         "--device", "cpu", "--out", str(out)] + (["--kv-cache", kv] if kv else [])) == 0
        printed = capsys.readouterr().out
        assert printed.strip().splitlines()[-1].startswith("PASS") and "(tol 1e-05)" in printed, printed
        logits[kv] = torch.from_numpy(np.load(out)["logits"])
    for other in ("fp8", ""):
        assert ((logits["nvfp4"] - logits[other]).abs().max() / logits[other].abs().max()).item() >= 1e-3, other
    assert cli.main(["run", "--kv-cache", "nvfp4", "--device", "cpu"]) == 2
    assert "kv_cache='nvfp4' needs head_dim a multiple of 32, not 16" in capsys.readouterr().err


@pytest.mark.parametrize("tied", [False, True])
def test_reference_vm_matches_transformers(tmp_path, tied):
    from megavm.schedule.checkpoint import load
    from megavm.schedule.config import ScheduleConfig
    from megavm.schedule.weights import program_weights
    from megavm.vm.compile import compile
    from megavm.vm.reference import ReferenceVM
    from megavm.vm.verify import greedy, reference_step

    model = hf_checkpoint(tmp_path, tied)
    ck = load(tmp_path)
    assert ck.cfg.rope_theta == 25000.0 and ck.cfg.tied_embeddings == tied and ck.dtype == "f32"
    if tied:
        assert "lm_head.weight" not in ck.hf
    vm = ReferenceVM(compile(ck.cfg, ScheduleConfig(dtype="f32", capacity=32, n_sms=6)), program_weights(ck.cfg, ck.hf))
    prompt = [11, 200, 3]
    ours = greedy(reference_step(vm), prompt, 12)
    seq = torch.tensor([prompt + ours.tokens[:-1]])
    with torch.no_grad():
        theirs = model(input_ids=seq).logits[0].float()          # [positions, vocab]
    assert theirs.shape[0] == len(ours.logits)
    for pos, lg in enumerate(ours.logits):
        err = (lg - theirs[pos]).abs().max().item()
        assert err <= 1e-4, f"{tied=}, {pos=}: max |logit diff| vs transformers {err:.2e} > 1e-4"
    assert ours.tokens == theirs[len(prompt) - 1:].argmax(-1).tolist(), f"{tied=}: greedy tokens differ from transformers"


def test_dlrm_run_saves_what_torch_computes(tmp_path):
    """megavm run on a DLRM preset: exit 0 (its own check against the torch DLRM), and the saved
    probabilities match the torch DLRM recomputed here from the same seeded weights and batches."""
    from megavm.flywheel.dlrm_torch import from_state
    from megavm.schedule.dlrm import PRESETS as DLRM
    from megavm.schedule.dlrm import random_state
    out = tmp_path / "dlrm.npz"
    assert cli.main(["run", "--model", "dlrm-tiny", "--batch", "5", "--batches", "3", "--device", "cpu",
                 "--out", str(out)]) == 0
    d = np.load(out)
    assert d["prob"].shape == (3, 5, 1) and d["sparse"].dtype == np.int32
    ref = from_state(DLRM["dlrm-tiny"], random_state(DLRM["dlrm-tiny"], seed=0))
    with torch.no_grad():
        want = torch.stack([ref(torch.from_numpy(x), torch.from_numpy(s)) for x, s in zip(d["dense"], d["sparse"])])
    assert (torch.from_numpy(d["prob"]) - want).abs().max().item() <= 1e-5
