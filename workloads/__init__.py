"""Workloads: datasets (real files or embedded statistics), arrival processes and SLO classes.

Public API: :func:`build_workload` → :class:`RequestTable`; :class:`DataMissingError` for absent files.
"""

from __future__ import annotations

from workloads.build import RequestTable, build_workload
from workloads.datasets import DataMissingError

__all__ = ["DataMissingError", "RequestTable", "build_workload"]
