"""An environment variable set for the duration of a block (the data folder, the compiled kernels' switch)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def environment(name: str, value: str) -> Iterator[None]:
    """``$name`` set to ``value`` inside the block, restored (or unset) after it."""
    old = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = old
