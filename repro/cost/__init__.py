"""The cost model: hardware and model specs (:mod:`.spec`), how a serving engine runs a pass (:mod:`.serving`), a
forward pass's seconds from first principles (:mod:`.model`) or from a measured profile (:mod:`.profile`), the
target's pass of one step (:mod:`.step`) and the calibration against published latencies (:mod:`.calibration`).

Imports only :mod:`repro.core`; ``python -m repro.cost`` (:mod:`.__main__`) is an entry point.
"""
