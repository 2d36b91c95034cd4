"""``python -m repro.plot DIR [DIR ...]``: the older name of ``python -m repro.render``, kept because earlier
instructions use it."""

from __future__ import annotations

import sys

from repro.experiments.render import main

if __name__ == "__main__":
    sys.exit(main())
