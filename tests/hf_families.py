"""Random-weight checkpoints of every family megavm lowers, built and saved by transformers' own model
classes (which nobody here wrote), and the check of a `megavm run --out` decode against the model's
forward. Used by tests/schedule/test_families.py (ReferenceVM on the CPU) and tests/gpu/ (megakernel)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

BASE = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, intermediate_size=96,
            vocab_size=301, rms_norm_eps=1e-5, max_position_embeddings=256)

# name -> (model_type, config fields over BASE)
CASES = {
    "llama-untied": ("llama", {}),
    "llama-tied-mha": ("llama", dict(num_key_value_heads=4, tie_word_embeddings=True)),
    "llama-mqa-llama3-rope": ("llama", dict(num_key_value_heads=1, rope_parameters={
        "rope_type": "llama3", "rope_theta": 50000.0, "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64})),
    "llama-linear-rope": ("llama", dict(rope_parameters={"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0})),
    "llama-yarn-rope": ("llama", dict(rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                                                       "original_max_position_embeddings": 64})),
    "llama-dynamic-rope": ("llama", dict(rope_parameters={"rope_type": "dynamic", "rope_theta": 10000.0,
                                                          "factor": 2.0})),
    "llama-longrope": ("llama", dict(rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0,
                                                      "short_factor": [1.0 + 0.1 * i for i in range(8)],
                                                      "long_factor": [2.0 + 0.5 * i for i in range(8)],
                                                      "original_max_position_embeddings": 64})),
    "llama-proportional-rope": ("llama", dict(rope_parameters={"rope_type": "proportional", "rope_theta": 10000.0,
                                                               "factor": 2.0})),
    "mistral-window-8": ("mistral", dict(sliding_window=8)),
    "mistral-no-window": ("mistral", dict(sliding_window=None, head_dim=24)),
    "qwen2-bias": ("qwen2", dict(tie_word_embeddings=False)),
    "qwen3-qk-norm": ("qwen3", dict(head_dim=32, tie_word_embeddings=True)),
    "gemma": ("gemma", dict(head_dim=16, num_key_value_heads=1)),
    "mixtral": ("mixtral", dict(num_local_experts=8, num_experts_per_tok=2, intermediate_size=48)),
    "qwen3-moe": ("qwen3_moe", dict(num_experts=8, num_experts_per_tok=3, moe_intermediate_size=40, head_dim=32,
                                    norm_topk_prob=True)),
    "qwen3-moe-dense-layer": ("qwen3_moe", dict(num_hidden_layers=3, num_experts=6, num_experts_per_tok=2,
                                                moe_intermediate_size=32, mlp_only_layers=[1], norm_topk_prob=False)),
}

# Checkpoints whose projections int4 (AWQ) can hold: inputs in groups of 128, outputs in 8s.
INT4_CASES = {
    "llama-int4": ("llama", dict(hidden_size=128, intermediate_size=256, vocab_size=304)),
    "qwen3-int4": ("qwen3", dict(hidden_size=128, head_dim=32, intermediate_size=384, vocab_size=304,
                                 tie_word_embeddings=True)),
}

# A Llama of K = 2048 and 4096 rows (1B's hidden size, 4096 down), for the 4-bit tensor-core GEMVs: at
# `--sms 16` every projection's tiles have 128 rows or more, so by default int4's all take the integer tensor
# cores (MVM_U4_IMMA) and NVFP4's down projection the e4m3 ones (MVM_E2M1_F8; gemv_xreg its K = 2048 rows).
# Its FFN twice as wide (down K = 8192) at `--sms 32`: every int4 tile takes the integer tensor cores, the
# down projection's (64 rows) with B in x's place (MVM_U4_IMMA_LONG).
TC_CASES = {"llama-k2048": ("llama", dict(hidden_size=2048, num_attention_heads=16, num_key_value_heads=4,
                                          head_dim=128, intermediate_size=4096, vocab_size=2048)),
            "llama-k2048-f8192": ("llama", dict(hidden_size=2048, num_attention_heads=16, num_key_value_heads=4,
                                                head_dim=128, intermediate_size=8192, vocab_size=2048))}
TC_SMS = 16
TC_LONG_SMS = 32

# A bf16 checkpoint whose attention takes the megakernel's tensor-core partial (head_dim 64, 4 query heads
# a KV head, bf16 K/V rows). Against transformers' f32 forward of the same bf16 weights the bf16 KV cache
# alone gives about 5e-3 of max |logit| (ReferenceVM on the CPU: 4.7e-3); the tolerance is 2e-2.
# bf16 checkpoints whose attention takes the partial's tensor-core path (docs/attention.md): a Llama with
# head_dim 64 and groups of 4, a Gemma with head_dim 256 and one group of 8 (Gemma-2B's shape), and a
# Qwen3-MoE whose bf16 experts take EXPERT_DOWN's pairs loop (docs/moe.md)
BF16_CASES = {"llama-hd64-g4": ("llama", dict(hidden_size=256, num_attention_heads=8, num_key_value_heads=2,
                                              head_dim=64, intermediate_size=384)),
              "gemma-hd256-g8": ("gemma", dict(hidden_size=256, num_attention_heads=8, num_key_value_heads=1,
                                               head_dim=256, intermediate_size=384)),
              # bf16 experts of 776 columns: EXPERT_DOWN's pairs loop at four pieces a lane (the last one
              # partial), and an odd top-k, so its trips end on one expert
              "qwen3-moe-bf16": ("qwen3_moe", dict(hidden_size=256, num_attention_heads=8, num_key_value_heads=2,
                                                   head_dim=64, num_experts=8, num_experts_per_tok=3,
                                                   moe_intermediate_size=776, norm_topk_prob=True))}
BF16_TOL = 2e-2

PROMPT = [11, 200, 3, 45, 7, 300, 19, 2, 88, 150, 9, 31]          # longer than a window of 8
TOKENS = 12


def model(name: str):
    """The transformers model of CASES[name], f32, with weights drawn so logits are O(1) and far from
    ties (the default init gives logits near 1e-3, where greedy tokens are coin flips)."""
    return _build(*(CASES | INT4_CASES | TC_CASES)[name])


def _build(kind: str, fields: dict):
    import transformers
    classes = {"llama": ("LlamaConfig", "LlamaForCausalLM"), "mistral": ("MistralConfig", "MistralForCausalLM"),
               "qwen2": ("Qwen2Config", "Qwen2ForCausalLM"), "qwen3": ("Qwen3Config", "Qwen3ForCausalLM"),
               "gemma": ("GemmaConfig", "GemmaForCausalLM"), "mixtral": ("MixtralConfig", "MixtralForCausalLM"),
               "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM")}
    conf, cls = (getattr(transformers, n) for n in classes[kind])
    torch.manual_seed(7)
    m = cls(conf(**{**BASE, **fields})).float().eval()
    offset = 1.0 if kind == "gemma" else 0.0        # Gemma's norms scale by 1 + weight
    with torch.no_grad():
        for pname, w in m.named_parameters():
            if w.ndim >= 2:            # matrices, and the expert stacks transformers keeps in memory
                w.copy_(torch.randn_like(w) / w.shape[-1] ** 0.5)
            elif pname.endswith(".bias"):
                w.copy_(0.3 * torch.randn_like(w))
            else:
                w.copy_(1 - offset + 0.1 * torch.randn_like(w))
    return m


def save(name: str, path: Path):
    m = model(name)
    m.save_pretrained(path, safe_serialization=True)
    return m


def save_bf16(name: str, path: Path):
    """BF16_CASES[name] saved in bf16 -> the transformers model of those bf16 weights, in f32 (the oracle)."""
    m = _build(*BF16_CASES[name]).to(torch.bfloat16)
    m.save_pretrained(path, safe_serialization=True)
    return m.float()


def run_args(path: Path, out: Path, device: str, sms: int | None = None) -> list[str]:
    return ["run", "--checkpoint", str(path), "--tokens", str(TOKENS), "--prompt", ",".join(map(str, PROMPT)),
            "--device", device, "--out", str(out)] + (["--sms", str(sms)] if sms else [])


def check_decode(name: str, m, out: Path, tol: float) -> float:
    """A saved decode (megavm run --out) against the transformers model's forward over the same tokens:
    greedy tokens identical, each position's logits within tol of its max |logit|. -> the largest error."""
    d = np.load(out)
    tokens, logits = d["tokens"].tolist(), torch.from_numpy(d["logits"])
    assert d["prompt"].tolist() == PROMPT and len(tokens) == TOKENS, (name, d["prompt"], tokens)
    seq = torch.tensor([PROMPT + tokens[:-1]])
    with torch.no_grad():
        theirs = m(input_ids=seq).logits[0].float()                    # [positions, vocab]
    assert theirs.shape == logits.shape, (name, theirs.shape, logits.shape)
    worst = 0.0
    for pos in range(len(logits)):
        err = (logits[pos] - theirs[pos]).abs().max().item() / theirs[pos].abs().max().item()
        assert err <= tol, f"{name} ({d['vm']}), {pos=}: max |logit diff| / max |logit| vs transformers {err:.2e} > {tol}"
        worst = max(worst, err)
    assert tokens == theirs[len(PROMPT) - 1:].argmax(-1).tolist(), f"{name} ({d['vm']}): greedy tokens differ"
    return worst


def check_fp8_run(name: str, tmp: Path, device: str, capsys, fmt: str = "fp8", sms: int | None = None) -> float:
    """CASES[name] saved by transformers, `megavm quantize --format fmt` (fp8 or nvfp4), then `megavm
    run --checkpoint` on the folder (on device, over sms queues if given), held to transformers' own model
    class loaded with the weights the folder stands for (its tied head untied, as the folder has it):
    check_decode at 1e-4 (f32)."""
    from megavm import cli
    from megavm.quantize_cli import dequantized
    m = save(name, tmp / "src")
    assert cli.main(["quantize", "--checkpoint", str(tmp / "src"), "--format", fmt, "--out", str(tmp / "q")]) == 0
    out = tmp / "decode.npz"
    assert cli.main(run_args(tmp / "q", out, device, sms)) == 0, capsys.readouterr()
    printed = capsys.readouterr().out
    assert f"{fmt} projections" in printed and "FAIL" not in printed, printed
    conf = m.config
    conf.tie_word_embeddings = False
    oracle = type(m)(conf).float().eval()
    oracle.load_state_dict(dequantized(tmp / "q"), strict=True)
    return check_decode(f"{name} {fmt}", oracle, out, 1e-4)


def check_folder_refusals(tmp: Path, fmt: str, edits, capsys, case: str = "llama-untied", config_edits=()) -> Path:
    """The checkpoint `case` quantized to fmt; for each (edit, message), the folder's tensors edited so
    and `megavm run --checkpoint` on it: exit 2 and one line holding message; then the same for each
    (field, value, message) of config_edits, quantization_config[field] set to value. Returns the
    folder, holding its good tensors and config again."""
    import json

    from safetensors.torch import load_file, save_file

    from megavm import cli
    save(case, tmp / "src")
    assert cli.main(["quantize", "--checkpoint", str(tmp / "src"), "--format", fmt, "--out", str(tmp / "q")]) == 0

    def refused(message):
        capsys.readouterr()
        assert cli.main(["run", "--checkpoint", str(tmp / "q"), "--tokens", "2", "--device", "cpu"]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and message in err, err

    f, cf = tmp / "q" / "model.safetensors", tmp / "q" / "config.json"
    good, good_conf = load_file(str(f)), cf.read_text()
    for edit, message in edits:
        t = {k: v.clone() for k, v in good.items()}
        edit(t)
        save_file(t, str(f), metadata={"format": "pt"})
        refused(message)
    save_file(good, str(f), metadata={"format": "pt"})
    for field, value, message in config_edits:
        conf = json.loads(good_conf)
        conf["quantization_config"][field] = value
        cf.write_text(json.dumps(conf))
        refused(message)
    cf.write_text(good_conf)
    return tmp / "q"

