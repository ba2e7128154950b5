"""Property-based fuzzing of the two parsers a file reaches: config.json (schedule/hf_config.py) and
the IR's JSON form (schedule/ir_json.py). Whatever the input, the only exception is megavm's own
UserError; and a program the loader accepts can be validated, and packed when valid, without any
other exception. 10,000 examples each, derandomized so CI sees the same ones every run."""
import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from megavm.core.errors import UserError
from megavm.fuzz import Node, small_program
from megavm.schedule import hf_config
from megavm.schedule.assign import assign
from megavm.schedule.ir import Program
from megavm.schedule.validate import validate
from megavm.vm.pack import pack

FUZZ = settings(max_examples=10_000, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

numbers = st.one_of(st.integers(), st.integers(-5, 5), st.integers(2 ** 31 - 2, 2 ** 64 + 2),
                    st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([0, 1, -1, 0.5, 1e308]))
json_values = st.recursive(st.none() | st.booleans() | numbers | st.text(max_size=12),
                           lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
                           max_leaves=5)

TINY = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 96, "vocab_size": 256,
        "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "tie_word_embeddings": False, "hidden_act": "silu"}
CONFIG_KEYS = sorted(TINY) + ["head_dim", "rope_scaling", "rope_parameters", "attention_bias", "mlp_bias",
                              "sliding_window", "use_sliding_window", "partial_rotary_factor", "layer_types"]


@FUZZ
@given(changes=st.dictionaries(st.sampled_from(CONFIG_KEYS) | st.text(max_size=8), json_values, max_size=4),
       drop=st.lists(st.sampled_from(sorted(TINY)), max_size=3), whole=st.none() | json_values)
def test_config_parser_raises_only_its_own_error(changes, drop, whole):
    hf = whole if whole is not None else {k: v for k, v in {**TINY, **changes}.items() if k not in drop}
    try:
        cfg = hf_config.parse(hf)
    except UserError:
        return
    assert cfg.n_heads % cfg.n_kv_heads == 0 and cfg.head_dim % 8 == 0 and cfg.dim >= 1, cfg


BASE = small_program(16, 8, [Node((0,), 16, 8), Node((1, 0), 16, 8)]).to_json()


def _paths(doc, prefix=()):
    """Every (container, key) path of the document, to mutate one of them."""
    out = []
    items = doc.items() if isinstance(doc, dict) else enumerate(doc) if isinstance(doc, list) else ()
    for k, v in items:
        out.append(prefix + (k,))
        out += _paths(v, prefix + (k,))
    return out


PATHS = _paths(json.loads(BASE))


@FUZZ
@given(path=st.sampled_from(PATHS), value=json_values, delete=st.booleans(), cut=st.integers(0, len(BASE)),
       garble=st.booleans())
def test_ir_loader_raises_only_its_own_error(path, value, delete, cut, garble):
    if garble:
        text = BASE[:cut] + json.dumps(value) + BASE[cut + 3:]
    else:
        doc = json.loads(BASE)
        holder = doc
        for k in path[:-1]:
            holder = holder[k]
        if delete and isinstance(holder, dict):
            del holder[path[-1]]
        else:
            holder[path[-1]] = value
        text = json.dumps(doc)
    try:
        program = Program.from_json(text)
    except UserError:
        return
    queues = assign(program, 3)
    if validate(program, queues).ok:
        pack(program, queues)
