"""The core's compiled kernels (:mod:`repro.core.jit`): a step's token trees checked one at a time in one call.

The NumPy code of :func:`repro.core.speculation.check_trees` stays as the reference (``REPRO_JIT=0``;
``tests/test_step_kernels.py`` runs whole simulations both ways; ``tests/test_engine.py`` checks faulty trees both
ways). Plain Python over arrays: it runs uncompiled too, only slowly.
"""

from __future__ import annotations

import numpy as np


def trees_connected(nodes: np.ndarray, counts: np.ndarray, sizes: np.ndarray, parent: np.ndarray) -> bool:
    """Whether every tree j's ``counts[j]`` selected nodes (the next of ``nodes``) are nodes of its candidate tree
    (below ``sizes[j]``, whose nodes' ``parent`` come next in that array) and each one's parent is selected too or
    is the root (-1)."""
    big = 1
    for j in range(sizes.shape[0]):
        if sizes[j] > big:
            big = sizes[j]
    sel = np.zeros(big, dtype=np.bool_)
    nb = 0
    cb = 0
    for j in range(counts.shape[0]):
        cnt = counts[j]
        size = sizes[j]
        for i in range(size):
            sel[i] = False
        for i in range(nb, nb + cnt):
            v = nodes[i]
            if v < 0 or v >= size:
                return False
            sel[v] = True
        for i in range(nb, nb + cnt):
            p = parent[cb + nodes[i]]
            if p >= 0 and not sel[p]:
                return False
        nb += cnt
        cb += size
    return True
