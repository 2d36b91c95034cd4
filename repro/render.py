"""``python -m repro.render DIR [DIR ...]``: redraw figures and summaries from a results folder's CSV alone.

The command line's entry point; the work is :mod:`repro.experiments.render`'s.
"""

from __future__ import annotations

import sys

from repro.experiments.render import main

if __name__ == "__main__":
    sys.exit(main())
