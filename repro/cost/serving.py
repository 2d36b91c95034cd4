"""Engine profiles: how the serving engine a paper ran executes speculation (docs/design.md, "Cost model").

The same plan costs different time on different engines. A profile (``conf/engine/NAME.yaml``, chosen per system in
its config and swappable with ``engine=NAME``) says, for one engine implementation:

- **scorer**: how the target scores proposals. ``multi_query``: one query of 1 + k tokens per sequence reads the
  sequence's KV once (vLLM's ``MQAScorer``, vLLM v1, FlexFlow Serve's tree-masked kernel). ``batch_expansion``:
  vLLM v0's ``BatchExpansionTop1Scorer`` turns a sequence with k proposals into k + 1 single-query sequences, so its
  KV is read k + 1 times and every per-sequence cost repeats, plus the host work of building the expanded batch
  (``expand_seq_s`` per expanded sequence). Only ``multi_query`` verifies token trees that branch
  (:attr:`EngineProfile.verifies_trees`).
- **CUDA graphs**: decode passes replay captured graphs up to ``graph_max_tokens`` tokens; passes that verify
  several tokens per sequence replay them only if ``verify_graphs`` (vLLM v1's piecewise graphs; vLLM v0 and FlexFlow
  Serve run verification eagerly).
- **draft memory**: ``draft_kv_layout`` is where a co-located draft's weights and KV live
  (:meth:`repro.cost.model.CostModel.kv_capacity_blocks`).
- **host-side speculation costs**: ``spec_seq_s`` per speculating sequence and ``spec_token_s`` per proposed token
  each step (proposal assembly, rejection sampling, output bookkeeping in the engine's Python or C++ runtime).
- **spec_with_prefill**: whether prefill chunks may share a step with speculation (vLLM v0: speculation and chunked
  prefill were mutually exclusive).
- **start-up memory** (``kv_accounting``): how the engine sizes its KV cache at start-up
  (:meth:`repro.cost.model.CostModel.non_kv_bytes`). ``reserve``: total × utilization − weights − a flat
  activation reserve per GPU (``CostModel.activation_reserve_gb``, 2 GiB; the suite's first model, kept by the
  FlexFlow Serve and ``pytorch_mq`` profiles, engines that do not size their KV cache by vLLM's rule).
  ``profile_run``: vLLM's start-up account (V1's ``determine_available_memory``, v0's
  ``determine_num_available_blocks``, the same rule): total × utilization − weights (target, draft model or
  EAGLE head) − the peak activations of a profiling pass over ``profile_tokens`` tokens (``max_num_batched_tokens``)
  and of the sampler over ``profile_seqs`` sequences (``max_num_seqs``) − ``cuda_graph_gib`` (the captured graphs'
  pool) − ``non_torch_gib`` (cuBLAS workspaces and other allocations outside PyTorch's allocator), per GPU. The pool
  then holds ``available // (block_size × KV bytes per token of every attention layer)`` blocks: the draft model's or
  the EAGLE head's layers are more layers of the same KV cache. The sampler's dummy run sorts the full vocabulary
  for top-k/top-p: ``sampler_bytes`` per sequence and vocabulary entry at its peak (logits, their fp32 copy, the
  sort's values, indices and temporaries), and a run with a speculative method (``profile_speculative``, set from
  the system: :attr:`repro.sim.policy.Policy.speculates`) adds the rejection sampler's dummy pass,
  ``rejection_sampler_bytes`` more. A system without scheduler budgets of its own is profiled at the profile's
  ``profile_tokens`` and ``profile_seqs``, or (``profile_serve_defaults``) at ``vllm serve``'s defaults on the run's
  GPU (:func:`vllm_serve_budgets`).
- **CUDA-graph capture sizes** (``graph_sizes``): a pass that replays a graph runs at the smallest captured size that
  holds its tokens (the padding tokens go through every linear layer); empty: no padding.
- **async scheduling** (``async_scheduling``): the host prepares step n + 1 while the GPU runs step n, so the host
  work of speculation (``spec_seq_s``, ``spec_token_s`` and a model-based proposer's per-round bookkeeping,
  ``HardwareSpec.spec_round_overhead_s``) overlaps the passes instead of adding to them. The simulator drops those
  terms rather than taking max(host, GPU): exact while they stay below the step's GPU time (a 0.8 ms round against
  a ≥ 6 ms pass of a ≥ 7B target on an H100). Prompt lookup's CPU matching stays charged (it runs between sampling
  and the next pass).
  A speculating run whose proposer is not in ``async_proposers`` runs synchronously (vLLM V1 keeps async
  scheduling only for the EAGLE family: ``vllm/config/vllm.py``; :func:`repro.sim.deployment.scheduled_with`). Under
  async scheduling two batches are in flight (V1's ``step_with_batch_queue``): a step that follows another at once
  was scheduled when that one started, so a request arriving during step n is first scheduled in step n + 2
  (:meth:`repro.sim.replica.Replica.admit`).
- **graph_sizes_spec_multiple**: with a speculative method of ``draft_tokens`` = k, the capture sizes are rounded up
  to multiples of 1 + k and those past the largest dropped (V1's ``adjust_cudagraph_sizes_for_spec_decode``).
- **first_token_drafts**: the drafter proposes after the target's pass in the same step, so a request's first token is
  released once its first ``draft_tokens`` drafts are proposed: the step that completes its prompt also runs the
  drafter's k − 1 draft steps for it (its prompt pass is the step's drafter pass; vLLM V1's ``gpu_model_runner.py``).
  ``draft_tokens`` is the run's ``num_speculative_tokens``, taken from a system with a fixed ``k``.
- **frontend** (``frontend_in_s``, ``frontend_out_s``): the API server's latency before a request reaches the engine
  (HTTP, tokenization, the hand-off to the engine core) and after each output leaves it (detokenization, streaming);
  TTFT and latency count from the client's send to its receipt (``vllm bench serve``), :class:`repro.sim.engine.Engine`.
- **draft_broadcast_s**: a draft model at TP 1 beside a target at TP > 1 runs on the driver rank, which broadcasts
  its proposals to the other ranks every speculating step (vLLM v0's ``smaller_tp_proposer_worker.py``): host
  seconds per step (:meth:`repro.cost.model.CostModel.draft_broadcast_s`).
- **spec_round** (default true): the engine spends the hardware's host round per speculating step
  (``HardwareSpec.spec_round_overhead_s``: vLLM's proposer set-up, sampling and proposal assembly) outside the passes.
  False for an engine whose measured passes already hold its host work (``hf_eager``: ``backend=hf`` times its
  drafting, glue included, and a profile of its passes prices the simulator's).
- **reports_kv_tokens**: the engine logs its KV capacity in tokens at start-up (vLLM V1's "GPU KV cache size: N
  tokens"): its runs' points.csv gets ``kv_cache_tokens``.
- **elastic memory** (:class:`~repro.sim.plan.MemoryAction`): ``kv_expand_s`` to grow the KV pool in place (allocate
  the segment, register its blocks) and ``reload_dispatch_s`` of host time to start an asynchronous draft reload.
  The only measurements are Nightjar Table 6's (its extension of vLLM, 32B on 2x L20): the defaults.

Every number is a property of the engine's code, shared by every experiment that runs on it; each profile's YAML
cites its sources.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, Literal

import yaml

from repro.cost.spec import CONF_DIR, UnknownSpecError, _to_dict

Scorer = Literal["multi_query", "batch_expansion"]
DraftKvLayout = Literal["spread", "vllm_v0"]
KvAccounting = Literal["reserve", "profile_run"]
#: keys of the ``engine`` config block that are run settings, not part of the engine's profile
RUN_KEYS = ("block_size", "gpu_memory_utilization", "draft_servers", "record_steps", "record_rounds",
            "counterfactual_arms", "fast_forward", "check_invariants", "max_model_len")


@dataclass(frozen=True, slots=True)
class EngineProfile:
    """One serving engine's implementation of speculation (see the module docstring for each field)."""

    name: str = "ideal"
    scorer: Scorer = "multi_query"
    verify_graphs: bool = True
    graph_max_tokens: int = 512
    draft_kv_layout: DraftKvLayout = "spread"
    spec_with_prefill: bool = True
    expand_seq_s: float = 0.0
    expand_reread: float = 1.0
    spec_seq_s: float = 0.0
    spec_token_s: float = 0.0
    kv_accounting: KvAccounting = "reserve"
    profile_tokens: int = 8192
    profile_seqs: int = 256
    profile_serve_defaults: bool = False
    sampler_bytes: float = 12.0
    rejection_sampler_bytes: float = 0.0
    profile_speculative: bool = False
    cuda_graph_gib: float = 0.0
    non_torch_gib: float = 0.0
    graph_sizes: tuple[int, ...] = ()
    async_scheduling: bool = False
    async_proposers: tuple[str, ...] = ()
    graph_sizes_spec_multiple: bool = False
    first_token_drafts: bool = False
    draft_tokens: int = 0
    frontend_in_s: float = 0.0
    frontend_out_s: float = 0.0
    draft_broadcast_s: float = 0.0
    spec_round: bool = True
    reports_kv_tokens: bool = False
    kv_expand_s: float = 0.1439
    reload_dispatch_s: float = 2.19e-5
    source: str = ""

    def __post_init__(self) -> None:
        if self.scorer not in ("multi_query", "batch_expansion"):
            raise ValueError(f"engine {self.name!r}: scorer must be 'multi_query' or 'batch_expansion', "
                             f"not {self.scorer!r}")
        if self.draft_kv_layout not in ("spread", "vllm_v0"):
            raise ValueError(f"engine {self.name!r}: draft_kv_layout must be 'spread' or 'vllm_v0', "
                             f"not {self.draft_kv_layout!r}")
        if self.kv_accounting not in ("reserve", "profile_run"):
            raise ValueError(f"engine {self.name!r}: kv_accounting must be 'reserve' or 'profile_run', "
                             f"not {self.kv_accounting!r}")
        sizes = tuple(self.graph_sizes)
        if any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in sizes) \
                or list(sizes) != sorted(set(sizes)):
            raise ValueError(f"engine {self.name!r}: graph_sizes must be increasing positive integers, "
                             f"got {list(sizes)}")
        object.__setattr__(self, "graph_sizes", sizes)
        object.__setattr__(self, "async_proposers", tuple(str(p) for p in self.async_proposers))
        for key in ("async_scheduling", "spec_round", "reports_kv_tokens", "profile_speculative",
                    "profile_serve_defaults", "graph_sizes_spec_multiple", "first_token_drafts"):
            if not isinstance(getattr(self, key), bool):
                raise ValueError(f"engine {self.name!r}: {key} must be true or false")
        for key in ("profile_tokens", "profile_seqs", "sampler_bytes", "rejection_sampler_bytes", "cuda_graph_gib",
                    "non_torch_gib",
                    "graph_max_tokens", "expand_seq_s", "expand_reread", "spec_seq_s", "spec_token_s", "kv_expand_s",
                    "reload_dispatch_s", "draft_tokens", "frontend_in_s", "frontend_out_s", "draft_broadcast_s"):
            v = getattr(self, key)
            if isinstance(v, bool) or not isinstance(v, int | float) or v < 0:
                raise ValueError(f"engine {self.name!r}: {key} must be a non-negative number, got {v!r}")

    def padded_tokens(self, num_tokens: int) -> int:
        """The tokens a CUDA-graph pass of ``num_tokens`` runs: the smallest capture size that holds them (itself
        without ``graph_sizes`` or above the largest)."""
        for size in self.graph_sizes:
            if size >= num_tokens:
                return size
        return num_tokens

    @property
    def verifies_trees(self) -> bool:
        """Whether the engine verifies branching token trees (only with ``multi_query``).

        A tree's attention mask needs one multi-token query per sequence; batch expansion scores a proposal as
        single-token sequences, one per position of one chain (vLLM v0's ``BatchExpansionTop1Scorer``).
        """
        return self.scorer == "multi_query"

    @classmethod
    def from_cfg(cls, cfg: Mapping[str, Any] | Any) -> EngineProfile:
        """Build from the ``engine`` config block (its run settings, :data:`RUN_KEYS`, are skipped).

        An unknown key raises ``TypeError`` naming it.
        """
        data = {k: v for k, v in _to_dict(cfg).items() if k not in RUN_KEYS}
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise TypeError(f"unknown engine key(s) {unknown}; an engine profile has {sorted(known)} "
                            f"and the run settings {list(RUN_KEYS)}")
        return cls(**data)


def vllm_serve_budgets(gpu: str, memory_gib: float) -> tuple[int, int]:
    """``(max_num_seqs, max_num_batched_tokens)`` that ``vllm serve`` (vLLM V1's API server) takes by default on a GPU
    (``vllm/engine/arg_utils.py`` ``get_batch_defaults``): 1024 and 8192 on a GPU with at least 70 GiB
    (``cudaMemGetInfo``'s total) that is not an A100, else 256 and 2048. ``gpu`` is its name or ``conf/hardware`` id."""
    if memory_gib >= 70 and "a100" not in gpu.lower():
        return 1024, 8192
    return 256, 2048


def available_engines() -> list[str]:
    """Ids of every ``conf/engine/*.yaml``."""
    return sorted(p.stem for p in (CONF_DIR / "engine").glob("*.yaml"))


def load_engine(name: str) -> EngineProfile:
    """``conf/engine/<name>.yaml`` as an :class:`EngineProfile` (unknown id → :class:`UnknownSpecError`)."""
    path = CONF_DIR / "engine" / f"{name}.yaml"
    if not path.is_file():
        raise UnknownSpecError(f"unknown engine {name!r}; available: {', '.join(available_engines())}")
    with path.open() as fh:
        data = yaml.safe_load(fh)
    return EngineProfile.from_cfg(data)
