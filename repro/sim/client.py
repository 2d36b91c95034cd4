"""The benchmark client's closed loop: vLLM's ``--max-concurrency C`` in front of the engine.

vLLM's serving benchmark (``benchmarks/benchmark_serving.py``, ``vllm bench serve``) releases requests by its arrival
process (Poisson at ``--request-rate``, or all at once when the rate is infinite) and sends each through
``limited_request_func``: ``async with semaphore`` (an ``asyncio.Semaphore(max_concurrency)``) around the request
function. A released request therefore waits, in release order (the semaphore's waiters are a FIFO), until one of the
C requests in flight has finished, and is sent at that instant. The request function takes its start time
``st = time.perf_counter()`` inside the semaphore, and TTFT, TPOT and end-to-end latency count from ``st``: from the
send, not the release. (As remembered from vLLM 0.6-0.8's ``benchmarks/backend_request_func.py`` and
``benchmark_serving.py``; ``repro/backends/openai.py`` times a live server the same way.) The benchmark's duration
runs from its start to the last completion, which is the simulator's ``sim_time_s`` either way.

:class:`ClosedLoop` is that client: the engine hands it each release and each finish, and it says which request is sent
when. The engine writes the send time as the request's ``arrival_s`` (what the server sees), so every latency metric
counts from the send.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Iterable

import numpy as np


class ClosedLoop:
    """At most ``max_concurrency`` requests in flight; a released request waits in a FIFO for a free slot.

    ``sent_at`` (one entry per request, the release times to start with) gets each request's send time."""

    def __init__(self, max_concurrency: int, sent_at: np.ndarray) -> None:
        if isinstance(max_concurrency, bool) or not isinstance(max_concurrency, (int, np.integer)) \
                or max_concurrency < 1:
            raise ValueError(f"max_concurrency must be a positive integer, got {max_concurrency!r}")
        self.cap = int(max_concurrency)
        self.sent_at = sent_at
        self.in_flight = 0  # sent, and not finished by the last event handled
        self.queue: deque[int] = deque()  # released, not sent: in release order
        self._frees: list[float] = []  # a heap of the finish times not handled yet (each frees a slot)

    def release(self, rid: int, at: float) -> bool:
        """Request ``rid`` is released at ``at``: whether it is sent at once (else it waits in the queue)."""
        if self.in_flight < self.cap:
            self._send(rid, at)
            return True
        self.queue.append(rid)
        return False

    def finished(self, at: Iterable[float]) -> None:
        """Requests finish at the times ``at`` (each frees its slot then: :meth:`free`)."""
        for t in at:
            heapq.heappush(self._frees, float(t))

    def next_free(self) -> float:
        """When the next slot frees (infinity: no finish pending)."""
        return self._frees[0] if self._frees else math.inf

    def free(self) -> int | None:
        """Free the slot of the earliest pending finish; return the request sent in it then (``None``: none waits)."""
        at = heapq.heappop(self._frees)
        self.in_flight -= 1
        if not self.queue:
            return None
        rid = self.queue.popleft()
        self._send(rid, at)
        return rid

    def never_waits(self, unreleased: int) -> bool:
        """Whether no request can wait any more: nothing queued, and the ``unreleased`` requests still to come fit in
        the free slots even if no request in flight ever finished."""
        return not self.queue and self.in_flight + unreleased <= self.cap

    def _send(self, rid: int, at: float) -> None:
        self.in_flight += 1
        self.sent_at[rid] = at
