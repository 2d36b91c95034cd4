"""``python -m repro.cost``: one step's cost breakdown as a JSON object.

Example: ``python -m repro.cost --model llama2-7b --hardware a100-80g --batch 8 --context 512 --draft llama-160m --k 4``
prints total_ms (including draft_ms: k sequential draft passes of ``batch`` tokens, and host_ms: the engine's
host-side speculation work), its components, the KV capacity in tokens and AdaServe's token budget. The pass is
charged as the engine charges it (:mod:`repro.cost.step`) under ``--engine`` (``conf/engine``, default vllm_v0: batch
expansion scores k proposals as k + 1 single-query sequences). ``--new-tokens`` > 1 without ``--k`` is a prefill chunk
of that many tokens per sequence on top of ``--context`` cached ones, which it reads.
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np

from repro.cost.model import CostModel
from repro.cost.serving import load_engine
from repro.cost.spec import UnknownSpecError, load_hardware, load_model
from repro.cost.step import DecodeBatch, PrefillBatch, verify_pass


def breakdown(cm: CostModel, batch: int, new_tokens: int = 1, context: int = 512, k: int = 0) -> dict[str, float]:
    """One step as the engine charges it (:mod:`repro.cost.step`), in ms per component: a decode pass (k = 0,
    ``new_tokens`` = 1), a verify pass of 1 + k tokens per sequence after k draft passes, or a prefill chunk of
    ``new_tokens`` tokens per sequence on ``context`` cached ones (which it reads), completing each prompt."""
    b, ctx = batch, context
    draft_s = host_s = 0.0
    none = np.zeros(0, dtype=np.int64)
    no_pre = PrefillBatch(none, none, 0.0, np.zeros(0, dtype=bool))
    if k or new_tokens == 1:  # decode (k = 0) or verify pass: 1 + k scored tokens per sequence
        if k:  # after k sequential draft passes
            draft_s = cm.spec_round_s() + sum(
                cm.forward_s(b, b, b * (ctx + i + 1), decode_only=True, which="draft") for i in range(k))
        dec = DecodeBatch(np.arange(b), np.ones(b, dtype=np.int64), np.full(b, ctx), np.full(b, k),
                          np.full(b, k > 0), {}, None)
        shape, host_s = verify_pass(cm.engine, no_pre, dec)
    else:  # prefill chunk: causal pairs q·(c + (q+1)/2), reads its cached prefix, LM head on the last token only
        q = new_tokens
        pre = PrefillBatch(np.arange(b), np.full(b, q), b * q * (ctx + (q + 1) / 2), np.ones(b, dtype=bool),
                           float(b * ctx))
        no_dec = DecodeBatch(none, none, none, none, np.zeros(0, dtype=bool), {}, None)
        shape, host_s = verify_pass(cm.engine, pre, no_dec)
    fc = cm.forward(shape)
    return {
        "total_ms": 1e3 * (fc.total_s + draft_s + host_s),
        "linear_ms": 1e3 * fc.linear_s,
        "attention_ms": 1e3 * fc.attention_s,
        "lm_head_ms": 1e3 * fc.lm_head_s,
        "allreduce_ms": 1e3 * fc.allreduce_s,
        "overhead_ms": 1e3 * fc.overhead_s,
        "draft_ms": 1e3 * draft_s,
        "host_ms": 1e3 * host_s,
        "kv_capacity_tokens": 16 * cm.kv_capacity_blocks(),
        "budget_tokens": cm.budget_tokens,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m repro.cost", description="One step's cost breakdown as a JSON object.")
    ap.add_argument("--model", required=True, help="target model id (conf/model)")
    ap.add_argument("--hardware", required=True, help="GPU id (conf/hardware)")
    ap.add_argument("--tp", type=int, default=1, help="tensor-parallel GPUs")
    ap.add_argument("--batch", type=int, default=8, help="sequences in the pass")
    ap.add_argument("--new-tokens", type=int, default=1, help="tokens per sequence (1 = decode)")
    ap.add_argument("--context", type=int, default=512, help="cached tokens per sequence")
    ap.add_argument("--draft", default=None, help="draft model id (chain speculation)")
    ap.add_argument("--k", type=int, default=0, help="draft tokens per sequence (needs --draft)")
    ap.add_argument("--engine", default="vllm_v0", help="engine profile (conf/engine): vllm_v0, vllm_v1, flexflow")
    a = ap.parse_args(argv)
    try:
        cm = CostModel(
            load_hardware(a.hardware),
            load_model(a.model),
            tp=a.tp,
            draft=load_model(a.draft) if a.draft else None,
            engine=load_engine(a.engine),
        )
    except UnknownSpecError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if a.k and not a.draft:
        print("error: --k needs --draft", file=sys.stderr)
        return 2
    out = breakdown(cm, a.batch, a.new_tokens, a.context, a.k)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
