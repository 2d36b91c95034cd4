"""What memory a profile cell may use, and this CPU's L2 cache: the host as :mod:`repro.profile` sees it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

SAFETY_BYTES = 1 << 30  # kept free beside a cell's estimate (allocator slack, cuBLAS workspace)


def free_bytes(torch: Any, device: str, cap_gib: float | None) -> int:
    """What a cell may use: the device's free memory (a CPU: MemAvailable) less a safety margin, at most
    ``cap_gib``."""
    free = int(torch.cuda.mem_get_info(device)[0]) if device.startswith("cuda") else _mem_available()
    free -= SAFETY_BYTES
    return min(free, int(cap_gib * 2**30)) if cap_gib is not None else free


def l2_bytes() -> int:
    """This CPU's per-core L2 cache (sysfs), 2 MiB when it cannot be read."""
    base = Path("/sys/devices/system/cpu/cpu0/cache")
    for index in sorted(base.glob("index*")) if base.is_dir() else []:
        try:
            if (index / "level").read_text().strip() == "2" and (index / "type").read_text().strip() != "Instruction":
                size = (index / "size").read_text().strip().upper()
                scale = {"K": 2**10, "M": 2**20, "G": 2**30}.get(size[-1:], 1)
                return int(size.rstrip("KMG")) * scale
        except (OSError, ValueError):
            continue
    return 2 * 2**20


def _mem_available() -> int:
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 1 << 62  # unknown: no limit but --max-memory-gib
