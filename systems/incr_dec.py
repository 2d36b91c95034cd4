"""Incremental decoding (IncrDec): continuous batching without speculation, prefill preempting ongoing decoding.

Li et al., "AdaServe: SLO-Customized LLM Serving with Fine-Grained Speculative Decoding", arXiv:2501.12162,
§6.1 "Baselines": the paper's own non-speculative baseline, implemented inside AdaServe's engine (FlexFlow Serve).
"IncrDec separates the prefill and decode stages, allowing new requests to preempt ongoing decoding during the
prefill stage, similar to vLLM." §6.1 also uses it to profile the *baseline latency* (batch 8, input 32, output 128).

Each iteration: (1) prefill stage: partially prefilled prompts continue and waiting requests are admitted in FCFS
order, within ``max_num_batched_tokens`` tokens per step (a prompt longer than that is prefilled in chunks over
consecutive prefill steps) and ``max_num_seqs`` running requests; if any prompt tokens run, the step is
prefill-only and every decode waits. (2) Otherwise, decode stage: every decode-ready running request generates one
token, preempting the most recently admitted by recompute when KV runs short.

Differences from ``vllm`` (where the paper and its engine say so):
- Batch limits are FlexFlow Serve's, not vLLM's: at most 64 requests per batch (``BatchConfig::MAX_NUM_REQUESTS`` =
  65 slots, one reserved) and 3000 tokens per batch (``BatchConfig::MAX_NUM_TOKENS``); vLLM's are 256 and 4096.
- Prompts longer than the token limit are split over several prefill-only steps (FlexFlow Serve consumes at most
  ``max_tokens_per_batch`` prompt tokens per iteration); vLLM would not admit them whole, so it never splits.
- No KV watermark (FlexFlow Serve has none).

Deviations:
- The paper gives no batch limits for IncrDec; we take FlexFlow Serve 25.2.1's compile-time caps (above).
- FlexFlow Serve allocates KV per request slot; we use the engine's paged KV with vLLM's recompute preemption so
  that memory pressure is handled like the other baselines.
"""

from __future__ import annotations

import numpy as np

from repro.sim.plan import IDLE, StepPlan, ids
from repro.sim.policy import Policy
from repro.sim.state import View
from systems.lib import continue_prefills, fcfs_admit, make_room, split_running


class IncrDec(Policy):
    speculates = False  # no speculative method configured
    repeats_plan = True  # its plan follows the queues and the KV pool only (the engine may fast-forward)
    keeps_plan_after_finish = True  # nothing waiting: the same decode step over whoever is left

    def __init__(self, max_num_seqs: int = 64, max_num_batched_tokens: int = 3000) -> None:
        if max_num_seqs < 1 or max_num_batched_tokens < 1:
            raise ValueError("max_num_seqs and max_num_batched_tokens must be positive")
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens

    def schedule(self, view: View) -> StepPlan:
        decode, prefilling = split_running(view)
        # (1) prefill stage: ongoing chunked prompts, then FCFS admissions, all within the step's token budget
        cont = continue_prefills(view, prefilling, token_budget=self.max_num_batched_tokens,
                                 free_blocks=view.free_blocks)
        free = view.free_blocks - (int(view.blocks_for(cont.rids, cont.tokens).sum()) if cont.rids.size else 0)
        new = fcfs_admit(view, token_budget=self.max_num_batched_tokens - cont.num_tokens,
                         max_new_seqs=self.max_num_seqs - view.running.size, free_blocks=free, chunk=True)
        if cont.rids.size or new.rids.size:  # prefill preempts ongoing decoding
            return StepPlan(prefill_ids=np.concatenate([cont.rids, new.rids]),
                            prefill_tokens=np.concatenate([cont.tokens, new.tokens]))
        # (2) decode stage: every decode-ready request, the most recently admitted preempted while KV runs short
        if decode.size == 0:
            # prompts stuck without KV and nothing decoding: give back the most recently admitted prompt's blocks
            return IDLE if prefilling.size <= 1 else StepPlan(preempt_ids=ids([prefilling[-1]]))
        kept, preempted, _ = make_room(view, decode, 1, view.free_blocks)
        return StepPlan(decode_ids=kept, preempt_ids=preempted)
