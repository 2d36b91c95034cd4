"""Real backends: the engine contract on real models (:mod:`repro.backends.hf`, its batched passes in
:mod:`repro.backends.ragged`), an OpenAI-compatible client that replays a workload against a live server
(:mod:`repro.backends.openai`) and a minimal server for it (:mod:`repro.backends.openai_server`). They need the
``real`` extra (PyTorch + transformers); the simulator does not.

May import the simulation core and the layers below it (:mod:`repro.sim`, :mod:`repro.cost`, :mod:`repro.core`).
"""
