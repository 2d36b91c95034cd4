"""``python -m repro.cost``: one step's cost breakdown as a JSON object.

Example: ``python -m repro.cost --model llama2-7b --hardware a100-80g --batch 8 --context 512 --draft
llama-160m --k 4``
prints total_ms (including draft_ms: k sequential draft passes of ``batch`` tokens), its components, the KV
capacity
in tokens and AdaServe's token budget. ``--new-tokens`` > 1 without ``--k`` is a prefill chunk of that many
tokens
per sequence on top of ``--context`` cached ones.
"""

from __future__ import annotations

import argparse
import json
import sys

from repro.cost.model import CostModel, ForwardShape
from repro.cost.spec import UnknownSpecError, load_hardware, load_model


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m repro.cost", description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--hardware", required=True)
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--batch", type=int, default=8, help="sequences in the pass")
    ap.add_argument("--new-tokens", type=int, default=1, help="tokens per sequence (1 = decode)")
    ap.add_argument("--context", type=int, default=512, help="cached tokens per sequence")
    ap.add_argument("--draft", default=None, help="draft model id (chain speculation)")
    ap.add_argument("--k", type=int, default=0, help="draft tokens per sequence (needs --draft)")
    a = ap.parse_args(argv)
    try:
        cm = CostModel(
            load_hardware(a.hardware),
            load_model(a.model),
            tp=a.tp,
            draft=load_model(a.draft) if a.draft else None,
        )
    except UnknownSpecError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if a.k and not a.draft:
        print("error: --k needs --draft", file=sys.stderr)
        return 2
    b, ctx = a.batch, a.context
    draft_s = 0.0
    if a.k:  # verify pass: 1 + k scored tokens per sequence, after k draft passes
        q = 1 + a.k
        shape = ForwardShape(b * q, b, b * (ctx + q), 0.0, b * q, decode_only=True)
        draft_s = sum(
            cm.forward_s(b, b, b * (ctx + i + 1), decode_only=True, which="draft") for i in range(a.k)
        )
    elif a.new_tokens == 1:
        shape = ForwardShape(b, b, b * (ctx + 1), 0.0, b, decode_only=True)
    else:  # prefill chunk: causal pairs q·(c + (q+1)/2), LM head on the last token only
        q = a.new_tokens
        shape = ForwardShape(b * q, b, 0.0, b * q * (ctx + (q + 1) / 2), b)
    fc = cm.forward(shape)
    out = {
        "total_ms": 1e3 * (fc.total_s + draft_s),
        "linear_ms": 1e3 * fc.linear_s,
        "attention_ms": 1e3 * fc.attention_s,
        "lm_head_ms": 1e3 * fc.lm_head_s,
        "allreduce_ms": 1e3 * fc.allreduce_s,
        "overhead_ms": 1e3 * fc.overhead_s,
        "draft_ms": 1e3 * draft_s,
        "kv_capacity_tokens": 16 * cm.kv_capacity_blocks(),
        "budget_tokens": cm.budget_tokens,
    }
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
