"""The papers' systems and their baselines: one policy per module, each a :class:`repro.sim.policy.Policy`
(shared pieces in :mod:`.lib` and :mod:`.trees`); the configs under ``conf/system/`` name them.

May import the simulation core and the layers below it; nothing imports a system but Hydra, from a config.
"""
