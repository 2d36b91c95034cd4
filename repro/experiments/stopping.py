"""Stopping a run: Ctrl-C and SIGTERM in the main process, worker processes that never outlive it.

- The command line turns SIGTERM into :class:`Stop` (a KeyboardInterrupt, as Ctrl-C is), so both stop a run the same
  way: the runner stops its workers, keeps the points that finished and raises :class:`Interrupted`; the command line
  prints :meth:`Interrupted.line` and exits with 128 + the signal's number (130 for Ctrl-C, 143 for SIGTERM).
- Worker processes (:func:`worker_init`) ignore Ctrl-C: the main process stops them (:func:`stop_workers`). They die
  with the main process, even a SIGKILLed one: Linux's parent-death signal, and a watchdog thread everywhere.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shlex
import signal
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from types import FrameType

from repro.experiments.results import display_path

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
WATCH_EVERY_S = 0.5


class Stop(KeyboardInterrupt):
    """A stop signal other than Ctrl-C (SIGTERM), raised in the main thread like Ctrl-C's KeyboardInterrupt."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class Interrupted(KeyboardInterrupt):
    """A run stopped by a signal with ``saved`` of its ``total`` points in ``path`` (None: none).

    ``wrote``: whether this run wrote there (not when it stopped before its first point finished).
    """

    def __init__(self, signum: int, saved: int, total: int, path: Path | None, wrote: bool) -> None:
        super().__init__(f"{saved} of {total} points saved")
        self.signum, self.saved, self.total, self.path, self.wrote = signum, saved, total, path, wrote

    def line(self, resume: str | None = None) -> str:
        """The one line the command line prints: what was saved and where, and ``resume`` (a command) if given."""
        where = f"in {display_path(self.path)}" if self.path is not None else "(nothing written)"
        text = f"interrupted: {self.saved} of {self.total} points saved {where}"
        return text + (f"; resume with: {resume}" if resume else "")


def signum_of(exc: BaseException) -> int:
    """The signal behind a KeyboardInterrupt: SIGTERM for :class:`Stop`, else SIGINT (Ctrl-C)."""
    return int(getattr(exc, "signum", signal.SIGINT))


def exit_status(exc: BaseException) -> int:
    """The shell's convention for a process stopped by a signal: 128 + its number (130 Ctrl-C, 143 SIGTERM)."""
    return 128 + signum_of(exc)


def _raise_stop(signum: int, frame: FrameType | None) -> None:
    raise Stop(signum)


def raise_on_sigterm() -> None:
    """Make SIGTERM raise :class:`Stop` in the main thread (the command line's runs; a library caller keeps its own)."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _raise_stop)


@contextlib.contextmanager
def signals_held(deliver: bool = True) -> Iterator[None]:
    """Hold Ctrl-C and SIGTERM while the block runs, then deliver the first one held (``deliver=False``: drop it).

    For a points.csv append or a stopping run's tidying up. Main thread only; elsewhere it does nothing.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held: list[int] = []
    signals = (signal.SIGINT, signal.SIGTERM)
    before = {s: signal.signal(s, lambda signum, frame: held.append(signum)) for s in signals}
    try:
        yield
    finally:
        for s, handler in before.items():
            signal.signal(s, handler if handler is not None else signal.SIG_DFL)
        if held and deliver:
            signal.raise_signal(held[0])


def resume_command(args: Sequence[str]) -> str:
    """The command line ``args`` (without ``python -m repro``) with ``resume=true``, ready to paste."""
    kept = [a for a in args if not a.lstrip("+").startswith("resume=")]
    return shlex.join(["python", "-m", "repro", *kept, "resume=true"])


# --------------------------------------------------------------------------------------------- workers


def worker_init(main_pid: int) -> None:
    """A pool worker's initializer: ignore Ctrl-C, take SIGTERM's default action, and die with process ``main_pid``."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a forked worker inherits the main process's handler
    parent = os.getppid()
    if parent == main_pid and sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):  # without it, the watchdog below still ends this worker
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if not _alive(main_pid) or os.getppid() != parent:  # the main process died before prctl took effect
        os._exit(1)
    threading.Thread(target=_watch, args=(main_pid, parent), name="repro-watchdog", daemon=True).start()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _watch(main_pid: int, parent: int) -> None:
    """End this worker once its parent is gone (it is re-parented) or the main process is (with a forkserver or
    spawn context the parent may be another process)."""
    while os.getppid() == parent and _alive(main_pid):
        time.sleep(WATCH_EVERY_S)
    os._exit(1)


def stop_workers(pool: ProcessPoolExecutor) -> None:
    """Kill a process pool's workers now and shut it down (its queued points dropped)."""
    # ProcessPoolExecutor has no public way to stop a running task before Python 3.14 (kill_workers)
    kill = getattr(pool, "kill_workers", None)
    if kill is not None:
        kill()
    else:
        for proc in list((getattr(pool, "_processes", None) or {}).values()):
            with contextlib.suppress(ProcessLookupError, AttributeError, ValueError):
                proc.kill()
    pool.shutdown(wait=True, cancel_futures=True)
