"""Workloads: datasets (real files or embedded statistics), arrival processes and SLO classes.

Public API: :func:`build_workload` → :class:`RequestTable` (with ``provenance``: :class:`DataSource` records);
:func:`check_data_root` validates ``$REPRO_DATA`` / ``workload.data_dir`` up front; :class:`DataMissingError` for
absent files and folders.

Imports only :mod:`repro.core` of the project's packages.
"""

from __future__ import annotations

from workloads.build import RequestTable, build_workload
from workloads.datasets import DataMissingError, check_data_root
from workloads.provenance import DataSource

__all__ = ["DataMissingError", "DataSource", "RequestTable", "build_workload", "check_data_root"]
