"""What a run measured: per-request latencies and their summary (:mod:`.summary`), the catalogue's derived
columns (:mod:`.derived`) and the fairness utilities (:mod:`.fairness`).

Reads plain tables and arrays; imports only :mod:`repro.core`.
"""
