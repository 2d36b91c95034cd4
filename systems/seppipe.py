"""SepPipe: a separate serving pipeline (model replica, GPUs, continuous batching) per request category.

Li et al., "AdaServe: SLO-Customized LLM Serving with Fine-Grained Speculative Decoding", arXiv:2501.12162,
§6.3 "Comparison with scheduling strategies based on continuous batching" (Figure 7): "SepPipe [...] uses separate
pipelines to serve requests from different services. Each pipeline operates with its own model replica and runs
continuous batching. [...] For fair comparison, we dedicate one node to each request category and scale the request
rate for each category proportionally. This evaluation is conducted on the Llama-2-70b-chat model."

``replicas()`` declares ``num_replicas`` pipelines, each an independent inner policy (incremental decoding by
default, ``replica_policy``) on its own GPUs (``tp_per_replica``); ``route`` sends a request of SLO class ``c`` to
pipeline ``c mod num_replicas`` (one pipeline per category of ``conf/workload/adaserve_mix.yaml``: urgent, search,
chat). The engine builds one cost model per pipeline with that pipeline's tensor parallelism, so each has its own
KV memory and step latency.

GPU split: by default every pipeline gets what the other systems get on their own (``tp_per_replica: ${tp}``), which
is the paper's "one node per category": Llama-2-70b at TP 4 gives three 4-GPU nodes (12 A100s); Llama-2-7b/13b at
TP 1 give three single-GPU pipelines (which fit in the paper's 4-GPU node with one GPU idle). Splitting one 4-GPU
node instead is a list, e.g. ``tp_per_replica: [2, 1, 1]`` for 7B/13B; it is impossible for 70B (FP16 weights,
≈ 140 GB, need at least two A100-80GB per pipeline, so four GPUs hold at most two pipelines), which is why the paper
gives SepPipe one node per category.

Deviations:
- The paper's "scale the request rate for each category proportionally" is a property of the experiment, not of the
  system: with one node per category SepPipe has ``num_replicas`` times the GPUs, so a fair comparison runs it at
  ``num_replicas`` times the request rate (same category mix) or reports rate per node.
- The paper does not name the continuous-batching scheduler inside each pipeline; we use AdaServe's IncrDec
  (``systems.incr_dec``), the paper's own continuous-batching baseline.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from repro.sim.plan import StepPlan
from repro.sim.policy import Policy, ReplicaSpec
from repro.sim.state import View
from systems.incr_dec import IncrDec


class SepPipe(Policy):
    def __init__(self, num_replicas: int = 3, tp_per_replica: int | Sequence[int] = 1,
                 replica_policy: Callable[[], Policy] | None = None) -> None:
        if num_replicas < 1:
            raise ValueError("num_replicas must be at least 1")
        tps = [int(tp_per_replica)] * num_replicas if isinstance(tp_per_replica, int) else [
            int(t) for t in tp_per_replica]
        if len(tps) != num_replicas or min(tps) < 1:
            raise ValueError(f"tp_per_replica must be a positive int or {num_replicas} positive ints, got {tps}")
        self.num_replicas = num_replicas
        self.tp_per_replica = tps
        make = replica_policy or IncrDec
        self._replicas = [ReplicaSpec(policy=make(), tp=tp) for tp in tps]

    def replicas(self) -> list[ReplicaSpec]:
        return self._replicas

    def route(self, rid: int, slo_class: int, views: list[View]) -> int:
        # one pipeline per request category (§6.3): class c -> pipeline c mod num_replicas
        return slo_class % self.num_replicas

    def schedule(self, view: View) -> StepPlan:
        raise RuntimeError("SepPipe only routes: each of its replicas schedules with its own policy")
