"""Static speculation's batch-size schedules: vLLM's ``num_speculative_tokens_per_batch_size`` (``k_by_batch_size``)
picks each decode step's k from its batch, and a malformed schedule is refused naming the key."""

from __future__ import annotations

import numpy as np
import pytest

from systems.static_sd import StaticSD
from tests.conftest import make_requests, run, spy


def test_each_step_speculates_the_k_its_batch_size_is_given() -> None:
    policy = StaticSD(k_by_batch_size=[[2, 5], [4, 2]])
    plans, _ = spy(policy)
    # six requests at once, of different lengths: the batch shrinks 6 -> 1 as they finish
    run(policy, make_requests(6, output_len=[8, 16, 24, 32, 40, 48]))
    seen = {}
    for p in plans:
        if p.decode_ids.size:
            assert (p.k == p.k[0]).all()
            seen.setdefault(int(p.decode_ids.size), set()).add(int(p.k[0]))
    assert seen[6] == seen[5] == {0} and seen[4] == seen[3] == {2} and seen[2] == seen[1] == {5}, seen


@pytest.mark.parametrize("bad", [[[4, 2], [2, 5]], [[0, 3]], [[2, -1]], [[2]], []])
def test_a_malformed_schedule_is_refused(bad: list[list[int]]) -> None:
    with pytest.raises(ValueError, match="k_by_batch_size"):
        StaticSD(k_by_batch_size=bad)


def test_without_a_schedule_every_step_speculates_k() -> None:
    policy = StaticSD(k=4)
    plans, _ = spy(policy)
    run(policy, make_requests(3, output_len=[8, 16, 24]))
    ks = np.concatenate([p.k for p in plans if p.decode_ids.size])
    assert ks.size and (ks == 4).all()
