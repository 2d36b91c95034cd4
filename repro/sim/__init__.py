"""The simulation core: the engine loop and one replica's step (:mod:`.engine`), the fast path that runs ahead
between events (:mod:`.fastforward`, :mod:`.lookahead`), the contract between a policy and the engine (:mod:`.plan`,
:mod:`.policy`), the batch's state (:mod:`.state`, :mod:`.kv`), the deployed proposers and replicas
(:mod:`.proposers`, :mod:`.deployment`), what a step costs (:mod:`.stepcost`) and its trace (:mod:`.trace`).

May import :mod:`repro.cost`, :mod:`repro.oracle`, :mod:`repro.metrics` and :mod:`repro.core`; never a backend,
a system, a workload or an experiment.
"""
