"""The command line's arguments: a parser whose every error is one line on stderr with exit status 2,
argument types that refuse what cannot be meant (0 or a negative count, a float where a count goes),
and the arguments several commands share."""
from __future__ import annotations

import argparse
import sys

from megavm.schedule.assign import DEFAULT_STRATEGY, STRATEGIES
from megavm.schedule.dlrm import MAX_BATCH
from megavm.schedule.dlrm import PRESETS as DLRM_PRESETS
from megavm.schedule.models import PRESETS

MAX_SMS = 1 << 16                 # SM queues: more than any GPU has, few enough to allocate at once
DEVICES = ("auto", "cpu", "cuda")


class Parser(argparse.ArgumentParser):
    """argparse, with a usage error reported as one line ("megavm run: error: ...") and exit status 2."""

    def error(self, message: str):
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        raise SystemExit(2)


def count(lo: int = 1, hi: int = (1 << 31) - 1):
    """An argument type: a decimal integer in [lo, hi]."""
    def parse(text: str) -> int:
        try:
            v = int(text, 10)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if not lo <= v <= hi:
            raise argparse.ArgumentTypeError(f"{v} is outside [{lo}, {hi}]")
        return v
    parse.__name__ = "count"
    return parse


def add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="tiny", choices=sorted(PRESETS) + sorted(DLRM_PRESETS),
                   help="model preset: a decoder, or a DLRM program (dlrm-*) (default: tiny)")
    p.add_argument("--checkpoint", metavar="DIR", help="a local Hugging Face folder of a Llama, Mistral, Qwen2, "
                                                        "Qwen3, Gemma, Mixtral or Qwen3-MoE model, bf16 or one "
                                                        "`megavm quantize` wrote (overrides --model)")
    p.add_argument("--dtype", choices=("f32", "bf16"),
                   help="weights and KV cache (default: f32 for tiny and dlrm-tiny, bf16 for other presets, a "
                        "checkpoint's own)")
    p.add_argument("--batch", type=count(1, MAX_BATCH), metavar="N",
                   help="samples per step of a DLRM program (default: 1; decoders run batch 1)")


def add_program_args(p: argparse.ArgumentParser, capacity_default: str) -> None:
    p.add_argument("--capacity", type=count(), metavar="N", help=f"KV cache positions (default: {capacity_default})")
    p.add_argument("--sms", type=count(1, MAX_SMS), metavar="N",
                   help="SM queues (default: the GPU's SM count, or 8 on a CPU)")
    p.add_argument("--strategy", default=DEFAULT_STRATEGY, choices=sorted(STRATEGIES),
                   help=f"SM assignment (default: {DEFAULT_STRATEGY})")
