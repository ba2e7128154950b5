"""Hostile input through the installed `megavm` console script: bad arguments, config.json fields,
safetensors and index files, and IR JSON. Every case must end with exit status 2, one line on stderr
naming the culprit, nothing on stdout, no traceback, and nothing written or changed."""
import hashlib
import json
import os
import shutil
import struct
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from megavm.schedule.models import PRESETS
from megavm.schedule.weights import random_hf_weights

safetensors = pytest.importorskip("safetensors.torch")

TINY = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 96, "vocab_size": 256,
        "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "tie_word_embeddings": False, "hidden_act": "silu",
        "torch_dtype": "float32"}
WEIGHTS = random_hf_weights(PRESETS["tiny"], torch.float32, seed=3)


def checkpoint(d: Path, config=None, tensors=None, shards: int = 0) -> Path:
    d.mkdir(parents=True)
    (d / "config.json").write_text(json.dumps(TINY if config is None else config))
    tensors = WEIGHTS if tensors is None else tensors
    if not shards:
        safetensors.save_file(tensors, str(d / "model.safetensors"))
        return d
    names, weight_map = sorted(tensors), {}
    for s in range(shards):
        f = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        safetensors.save_file({n: tensors[n] for n in names[s::shards]}, str(d / f))
        weight_map.update({n: f for n in names[s::shards]})
    (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    return d


def cfg(**changes) -> dict:
    return {**TINY, **changes}


def truncated(d: Path, keep) -> Path:
    checkpoint(d)
    f = d / "model.safetensors"
    blob = f.read_bytes()
    f.write_bytes(blob[:keep(len(blob))])
    return d


def config_text(d: Path, text: str) -> Path:
    checkpoint(d)
    (d / "config.json").write_text(text)
    return d


def huge_header(d: Path) -> Path:
    """A header length field of 1 TiB."""
    checkpoint(d)
    f = d / "model.safetensors"
    f.write_bytes(struct.pack("<Q", 1 << 40) + f.read_bytes()[8:])
    return d


def header_changed(d: Path, change) -> Path:
    """A checkpoint whose safetensors header is rewritten by change(header dict)."""
    checkpoint(d)
    f = d / "model.safetensors"
    blob = f.read_bytes()
    n = struct.unpack("<Q", blob[:8])[0]
    hdr = json.loads(blob[8:8 + n])
    change(hdr)
    raw = json.dumps(hdr).encode()
    raw += b" " * (-len(raw) % 8)
    f.write_bytes(struct.pack("<Q", len(raw)) + raw + blob[8 + n:])
    return d


def overlap(hdr):
    a, b = sorted(k for k in hdr if k != "__metadata__")[:2]
    hdr[b]["data_offsets"] = hdr[a]["data_offsets"]


def index_changed(d: Path, change) -> Path:
    checkpoint(d, shards=2)
    f = d / "model.safetensors.index.json"
    f.write_text(change(json.loads(f.read_text())))
    return d


def symlinked_shard(d: Path) -> Path:
    checkpoint(d, shards=2)
    outside = d.parent / "elsewhere.safetensors"
    shard = d / "model-00002-of-00002.safetensors"
    shard.rename(outside)
    shard.symlink_to(outside)
    return d


def program(d: Path, change=None, text=None) -> Path:
    """A saved tiny program (IR JSON), changed by change(doc), or the given text."""
    from megavm.schedule.config import ScheduleConfig
    from megavm.schedule.lower import lower
    d.mkdir(parents=True)
    f = d / "program.json"
    if text is None:
        doc = json.loads(lower(PRESETS["tiny"], ScheduleConfig(dtype="f32", capacity=32, n_sms=4)).to_json())
        if change:
            change(doc)
        text = json.dumps(doc)
    f.write_text(text)
    return f


def adapter(d: Path, r: int = 2, tensor_r: int = 2, targets=("q",), config=None) -> Path:
    """A PEFT LoRA folder for the tiny preset: r in adapter_config.json, tensors of rank tensor_r."""
    from megavm.schedule.adapters import features, key
    d.mkdir(parents=True)
    conf = {"peft_type": "LORA", "r": r, "lora_alpha": 4, "target_modules": ["q_proj"]} if config is None else config
    (d / "adapter_config.json").write_text(json.dumps(conf))
    tiny = PRESETS["tiny"]
    tensors = {}
    for l in range(tiny.n_layers):
        for t in targets:
            k, n = features(tiny, t)
            tensors[key(l, t, "A")], tensors[key(l, t, "B")] = torch.zeros(tensor_r, k), torch.zeros(n, tensor_r)
    safetensors.save_file(tensors, str(d / "adapter_model.safetensors"))
    return d


def set_task(field, value, task=0):
    return lambda doc: doc["tasks"][task].__setitem__(field, value)


# (id, args given the case's folder, words stderr must hold)
CASES = [
    ("sms-negative", lambda d: ["run", "--sms", "-1"], "argument --sms: -1 is outside"),
    ("sms-zero", lambda d: ["run", "--sms", "0"], "argument --sms: 0 is outside"),
    ("sms-huge", lambda d: ["validate", "--sms", "100000"], "argument --sms: 100000 is outside"),
    ("validate-sms-negative", lambda d: ["validate", "--sms", "-3"], "argument --sms: -3"),
    ("capacity-zero", lambda d: ["run", "--capacity", "0"], "argument --capacity: 0 is outside"),
    ("tokens-zero", lambda d: ["run", "--tokens", "0"], "argument --tokens: 0 is outside"),
    ("tokens-float", lambda d: ["run", "--tokens", "1.5"], "argument --tokens: '1.5' is not an integer"),
    ("seeds-negative", lambda d: ["run", "--seeds", "-1"], "argument --seeds: -1 is outside"),
    ("programs-negative", lambda d: ["fuzz", "--programs", "-5"], "argument --programs: -5 is outside"),
    ("unknown-model", lambda d: ["run", "--model", "nope"], "argument --model: invalid choice: 'nope'"),
    ("unknown-argument", lambda d: ["run", "--bogus"], "unrecognized arguments: --bogus"),
    ("prompt-not-ids", lambda d: ["run", "--prompt", "1,x"], "--prompt '1,x': expected comma-separated token ids"),
    ("prompt-outside-vocab", lambda d: ["run", "--prompt", "999"], "--prompt token ids [999] are outside"),
    ("capacity-below-positions", lambda d: ["run", "--tokens", "40", "--capacity", "16"], "--capacity 16 is below"),
    ("validate-capacity-huge", lambda d: ["validate", "--capacity", "1000000000"], "needs 244141 attention blocks"),
    ("validate-capacity-past-combine", lambda d: ["validate", "--capacity", "20000000"], "a combine of 2 query heads"),
    ("run-capacity-huge", lambda d: ["run", "--capacity", "1000000000"], "GiB of host memory"),
    ("no-folder", lambda d: ["run", "--checkpoint", str(d / "absent")], "no config.json"),
    ("batch-on-decoder", lambda d: ["run", "--batch", "4"], "--batch is a DLRM program's setting"),
    ("dlrm-capacity", lambda d: ["run", "--model", "dlrm-tiny", "--capacity", "64"], "--capacity is a decoder's"),
    ("dlrm-batch-zero", lambda d: ["run", "--model", "dlrm-tiny", "--batch", "0"], "argument --batch: 0 is outside"),
    ("dlrm-batch-huge", lambda d: ["validate", "--model", "dlrm-tiny", "--batch", "5000"], "5000 is outside [1, 4096]"),
    ("out-no-directory", lambda d: ["run", "--out", str(d / "absent" / "x.npz")], "directory"),
    ("out-suffix", lambda d: ["run", "--out", str(d / "x.txt")], "the file name must end in .npz"),
    ("qwen2-bias-missing", lambda d: ["run", "--checkpoint", str(checkpoint(d, cfg(model_type="qwen2")))],
     "model.layers.0.self_attn.q_proj.bias"),
    ("qwen3-norm-missing", lambda d: ["run", "--checkpoint", str(checkpoint(d, cfg(model_type="qwen3")))],
     "q_norm.weight"),
    ("gemma-relu", lambda d: ["run", "--checkpoint", str(checkpoint(d, cfg(model_type="gemma", hidden_act="relu")))],
     "hidden_act='relu' is not supported: Gemma's MLP is GELU (tanh)"),
    ("config-not-json", lambda d: ["validate", "--checkpoint", str(config_text(d, "{"))], "config.json: not JSON"),
    ("config-a-list", lambda d: ["run", "--checkpoint", str(checkpoint(d, config=[1, 2]))], "not a JSON object"),
    ("model-type-gpt2", lambda d: ["validate", "--checkpoint", str(checkpoint(d, cfg(model_type="gpt2")))],
     "model_type='gpt2'"),
    ("attention-bias", lambda d: ["run", "--checkpoint", str(checkpoint(d, cfg(attention_bias=True)))],
     "attention_bias=True is not supported"),
    ("heads-not-multiple", lambda d: ["validate", "--checkpoint", str(checkpoint(d, cfg(num_key_value_heads=3)))],
     "num_attention_heads=4 is not a multiple of num_key_value_heads=3"),
    ("kv-heads-zero", lambda d: ["validate", "--checkpoint", str(checkpoint(d, cfg(num_key_value_heads=0)))],
     "num_key_value_heads=0 must be in"),
    ("hidden-negative", lambda d: ["validate", "--checkpoint", str(checkpoint(d, cfg(hidden_size=-64)))],
     "hidden_size=-64 must be in"),
    ("hidden-string", lambda d: ["validate", "--checkpoint", str(checkpoint(d, cfg(hidden_size="64")))],
     "hidden_size='64' must be an integer"),
    ("hidden-bool", lambda d: ["validate", "--checkpoint", str(checkpoint(d, cfg(hidden_size=True)))],
     "hidden_size=True must be an integer"),
    ("hidden-float", lambda d: ["validate", "--checkpoint", str(checkpoint(d, cfg(hidden_size=64.0)))],
     "hidden_size=64.0 must be an integer"),
    ("hidden-huge", lambda d: ["validate", "--checkpoint", str(checkpoint(d, cfg(hidden_size=2 ** 40)))],
     "hidden_size=1099511627776 must be in"),
    ("eps-string", lambda d: ["validate", "--checkpoint", str(checkpoint(d, cfg(rms_norm_eps="1e-5")))],
     "rms_norm_eps='1e-5' must be a number"),
    ("rope-unknown", lambda d: ["validate", "--checkpoint", str(checkpoint(d, cfg(rope_scaling={"rope_type": "ntk",
                                                                                                "factor": 4.0})))],
     "rope_scaling.rope_type='ntk' is not supported"),
    ("act-gelu", lambda d: ["run", "--checkpoint", str(checkpoint(d, cfg(hidden_act="gelu")))],
     "hidden_act='gelu' is not supported"),
    ("sliding-some-layers", lambda d: ["run", "--checkpoint", str(checkpoint(d, cfg(model_type="qwen2",
                                                                                    use_sliding_window=True)))],
     "use_sliding_window=True is not supported: sliding windows in some layers only"),
    ("safetensors-half", lambda d: ["run", "--checkpoint", str(truncated(d, lambda n: n // 2))],
     "model.safetensors: not a safetensors file megavm can read"),
    ("safetensors-5-bytes", lambda d: ["validate", "--checkpoint", str(truncated(d, lambda n: 5))],
     "model.safetensors: not a safetensors file megavm can read"),
    ("safetensors-empty", lambda d: ["validate", "--checkpoint", str(truncated(d, lambda n: 0))],
     "model.safetensors: not a safetensors file megavm can read"),
    ("safetensors-huge-header", lambda d: ["validate", "--checkpoint", str(huge_header(d))], "header too large"),
    ("safetensors-overlap", lambda d: ["validate", "--checkpoint", str(header_changed(d, overlap))], "invalid offset"),
    ("safetensors-int8", lambda d: ["validate", "--checkpoint",
                                    str(checkpoint(d, tensors={**WEIGHTS, "model.norm.weight": torch.ones(64, dtype=torch.int8)}))],
     "model.norm.weight: dtype I8"),
    ("tensor-missing", lambda d: ["validate", "--checkpoint",
                                  str(checkpoint(d, tensors={k: v for k, v in WEIGHTS.items() if "up_proj" not in k}))],
     "lacks 2 tensor(s)"),
    ("tensor-misshapen", lambda d: ["validate", "--checkpoint",
                                    str(checkpoint(d, tensors={**WEIGHTS, "model.norm.weight": torch.ones(65)}))],
     "model.norm.weight: (65,), expected (64,)"),
    ("tensor-nan", lambda d: ["run", "--checkpoint",
                              str(checkpoint(d, tensors={**WEIGHTS, "model.norm.weight": torch.full((64,), float("nan"))}))],
     "holding NaN or inf: model.norm.weight (64 values)"),
    ("unicode-names", lambda d: ["validate", "--checkpoint",
                                 str(checkpoint(d, tensors={k: v for k, v in WEIGHTS.items() if k != "model.norm.weight"}
                                                | {"model.norm.weight\u200b": torch.ones(64)}))],
     "lacks 1 tensor(s) its config.json implies: ['model.norm.weight']"),
    ("index-not-json", lambda d: ["validate", "--checkpoint", str(index_changed(d, lambda i: "{"))], "not JSON"),
    ("index-no-map", lambda d: ["validate", "--checkpoint", str(index_changed(d, lambda i: json.dumps({"weight_map": 3})))],
     "no 'weight_map' object"),
    ("index-path-escape", lambda d: ["validate", "--checkpoint", str(index_changed(
        d, lambda i: json.dumps({"weight_map": {**i["weight_map"], "model.norm.weight": "../../etc/passwd"}})))],
     "shard '../../etc/passwd' is not a file name inside the folder"),
    ("index-absent-shard", lambda d: ["validate", "--checkpoint", str(index_changed(
        d, lambda i: json.dumps({"weight_map": {**i["weight_map"], "model.norm.weight": "gone.safetensors"}})))],
     "lists shards that are not there"),
    ("symlinked-shard", lambda d: ["validate", "--checkpoint", str(symlinked_shard(d))], "outside the checkpoint folder"),
    ("ir-not-json", lambda d: ["validate", "--program", str(program(d, text="{not json"))], "not a megavm program"),
    ("ir-missing-file", lambda d: ["validate", "--program", str(d / "absent.json")], "absent.json: cannot read it"),
    ("ir-op-bool", lambda d: ["validate", "--program", str(program(d, set_task("op", True)))],
     "task 0 op is a boolean, not an integer"),
    ("ir-op-float", lambda d: ["validate", "--program", str(program(d, set_task("op", 1.9)))],
     "task 0 op is a number, not an integer"),
    ("ir-in-string", lambda d: ["validate", "--program", str(program(d, set_task("in", "tok_emb")))],
     "task 0 in is a string, not a list"),
    ("ir-shape-float", lambda d: ["validate", "--program", str(program(d, lambda doc: doc["buffers"][0].__setitem__(3, [1.7])))],
     "buffer 0 ('tok_emb') shape[0] is a number, not an integer"),
    ("ir-bytes-huge", lambda d: ["validate", "--program", str(program(d, set_task("bytes", 10 ** 40)))],
     "task 0 bytes=10000000000000000000000000000000000000000 is outside"),
    ("ir-embedding-2-40", lambda d: ["validate", "--program", str(program(
        d, lambda doc: doc["buffers"][0].__setitem__(3, [2 ** 40, 64])))], "shape[0]=1099511627776 is outside"),
    ("ir-nan", lambda d: ["validate", "--program", str(program(d, text='{"megavm_ir": 1, "x": NaN}'))],
     "NaN is not a number JSON holds"),
    ("ir-deep", lambda d: ["validate", "--program", str(program(d, text="[" * 100000 + "]" * 100000))], "nested too deeply"),
    ("ir-long-integer", lambda d: ["validate", "--program", str(program(d, text='{"megavm_ir": ' + "9" * 5000 + "}"))],
     "not a megavm program"),
    ("ir-nul-name", lambda d: ["validate", "--program", str(program(d, lambda doc: doc["buffers"][0].__setitem__(0, "a\0b")))],
     "name 'a\\x00b' must be 1 to"),
    ("ir-version-bool", lambda d: ["validate", "--program", str(program(d, lambda doc: doc.__setitem__("megavm_ir", True)))],
     "unsupported megavm IR version True"),
    ("ir-unknown-task-key", lambda d: ["validate", "--program", str(program(d, set_task("evil", 1)))],
     "task 0 has unknown ['evil']"),
    ("ir-too-many-waits", lambda d: ["validate", "--program", str(program(d, set_task("waits", [[0, 1]] * 5, task=-1)))],
     "waits has 5 entries; the ABI holds 4"),
    ("adapter-no-folder", lambda d: ["run", "--adapter", str(d / "absent")], "no such adapter folder"),
    ("adapter-id-without-adapters", lambda d: ["run", "--adapter-id", "1"], "--adapter-id 1: 0 adapters are loaded"),
    ("adapter-id-out-of-range", lambda d: ["run", "--adapter", str(adapter(d / "a")), "--adapter-id", "2"],
     "--adapter-id 2: 1 adapters are loaded"),
    ("adapter-rank-mismatch", lambda d: ["run", "--adapter", str(adapter(d / "a", r=4))],
     "lora_A.weight: shape (2, 64), expected (4, 64) (r=4)"),
    ("adapter-target-mismatch", lambda d: ["run", "--adapter", str(adapter(d / "a", targets=("k",)))],
     "q_proj.lora_A.weight"),
    ("adapter-lm-head", lambda d: ["run", "--adapter", str(adapter(d / "a", config={
        "peft_type": "LORA", "r": 2, "lora_alpha": 4, "target_modules": ["lm_head"]}))], "lm_head"),
    ("adapter-on-dlrm", lambda d: ["run", "--model", "dlrm-tiny", "--adapter", str(d)],
     "--adapter and --adapter-id are a decoder's settings"),
    ("kv-nvfp4-head-dim-16", lambda d: ["run", "--kv-cache", "nvfp4"],
     "kv_cache='nvfp4' needs head_dim a multiple of 32"),
    ("bench-fp8-moe", lambda d: ["bench", "--model", "llama-1b,qwen3-30b-a3b", "--weights", "fp8"],
     "--weights fp8 takes dense presets; ['qwen3-30b-a3b']"),
]


def _snapshot(d: Path) -> dict[str, str]:
    return {str(p.relative_to(d)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
            for p in sorted(d.rglob("*")) if not p.is_symlink()}


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory):
    exe = shutil.which("megavm")
    assert exe, "the megavm console script is not installed: pip install -e '.[test,checkpoint]'"
    root = tmp_path_factory.mktemp("hostile")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"OMP_NUM_THREADS": "1"}

    def one(case):
        name, make, _ = case
        d = root / name
        args = make(d / "in")
        cwd = d / "cwd"
        cwd.mkdir(parents=True)
        before = _snapshot(d)
        r = subprocess.run([exe, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
        return name, r, before == _snapshot(d)
    with ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 2)) as pool:
        return {name: (r, unchanged) for name, r, unchanged in pool.map(one, CASES)}


@pytest.mark.parametrize("name, words", [(c[0], c[2]) for c in CASES], ids=[c[0] for c in CASES])
def test_hostile_input_is_one_line_exit_2(outcomes, name, words):
    r, unchanged = outcomes[name]
    err = r.stderr.strip().splitlines()
    assert r.returncode == 2, f"{name}: exit {r.returncode}\n{r.stdout}{r.stderr}"
    assert len(err) == 1 and "Traceback" not in r.stderr and r.stdout == "", f"{name}:\n{r.stdout}{r.stderr}"
    assert err[0].startswith("megavm"), err[0]
    assert words in err[0], f"{name}: {words!r} not in {err[0]!r}"
    assert unchanged, f"{name}: files changed or were written"


def test_safetensors_missing_is_named(tmp_path):
    """Without the checkpoint extra, --checkpoint says which package to install."""
    exe = shutil.which("megavm")
    assert exe
    shadow = tmp_path / "shadow" / "safetensors"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('safetensors is not installed')\n")
    ck = checkpoint(tmp_path / "ck")
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "shadow"), "OMP_NUM_THREADS": "1"}
    r = subprocess.run([exe, "validate", "--checkpoint", str(ck)], cwd=tmp_path, env=env, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "pip install 'megavm[checkpoint]'" in r.stderr, r.stderr


def test_a_good_checkpoint_and_program_pass_the_same_doors(tmp_path):
    """The table's inputs are bad only where they say: the unchanged ones are accepted."""
    exe = shutil.which("megavm")
    ck, sharded, prog = checkpoint(tmp_path / "ck"), checkpoint(tmp_path / "sh", shards=3), program(tmp_path / "p")
    for args in (["validate", "--checkpoint", str(ck)], ["validate", "--checkpoint", str(sharded)],
                 ["validate", "--program", str(prog), "--sms", "4"]):
        r = subprocess.run([exe, *args], cwd=tmp_path, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0 and "program valid" in r.stdout, f"{args}:\n{r.stdout}{r.stderr}"
