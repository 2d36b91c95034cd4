"""A recorded draft model (``oracle=trace``, :meth:`TokenOracle.use_trace`, ``repro.oracle.streams._TraceStream``) on
hand-written recordings: request r replays recorded request r mod R position by position, a position the recording
does not cover is a miss, the request's level is its recorded share of rank-0 positions, and a recording that does
not fit the run is refused in one line (or, past its end, counted as misses where the run says so)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from repro.oracle import TokenOracle
from repro.oracle.token_oracle import RECORDING_META

pytestmark = pytest.mark.usefixtures("no_data")

W = 16  # the oracle's width: a rank past it (or an unrecorded position) is a miss

#: (rid, ranks by position, p0 by position): recorded request 0 accepts, accepts, misses (rank 1), accepts, accepts;
#: request 1 misses at once, then accepts twice
RECORDED = {0: ([0, 0, 1, 0, 0], [0.9, 0.8, 0.3, 0.7, 0.6]), 1: ([3, 0, 0], [0.2, 0.9, 0.95])}


def _recording(path: Path, meta: dict[str, object] | None = None, rows: dict[int, tuple[list[int], list[float]]]
               | None = None) -> Path:
    frame = pd.DataFrame([{"rid": rid, "pos": pos, "rank": rank, "p0": p0}
                          for rid, (ranks, p0s) in (RECORDED if rows is None else rows).items()
                          for pos, (rank, p0) in enumerate(zip(ranks, p0s, strict=True))],
                         columns=["rid", "pos", "rank", "p0"])
    if meta is not None:
        frame.attrs[RECORDING_META] = meta
    frame.to_parquet(path, index=False)
    return path


def _oracle(n: int = 4) -> TokenOracle:
    return TokenOracle(0, np.full(n, "sharegpt", dtype=object), {"sharegpt": 0.5}, width=W)


META: dict[str, object] = {"target": "llama2-7b", "draft": "llama-160m", "output_len": [5, 3]}


def test_each_request_replays_its_recorded_request_position_by_position(tmp_path: Path) -> None:
    oracle = _oracle()
    oracle.use_trace(_recording(tmp_path / "r.parquet", META), target="llama2-7b", draft="llama-160m")
    assert oracle.notes == []
    rids = np.array([0, 1, 2, 3])  # 2 and 3 replay recorded requests 0 and 1
    proposed, accepted, matched = oracle.score_chain(rids, np.zeros(4, dtype=np.int64), np.full(4, 4))
    assert proposed.tolist() == [4, 4, 4, 4]
    assert accepted.tolist() == [2, 0, 2, 0]  # up to the first rank other than 0
    assert matched.tolist() == [3, 2, 3, 2]  # every rank-0 position among the four (request 1's 4th: unrecorded)
    # from position 3: request 0 accepts its last two recorded positions, then the unrecorded one is a miss
    proposed, accepted, matched = oracle.score_chain(np.array([0, 1]), np.array([3, 1]), np.array([3, 3]))
    assert accepted.tolist() == [2, 2] and matched.tolist() == [2, 2]
    assert oracle.score_chain(np.array([0]), np.array([5]), np.array([4]))[1:] == (np.array([0]), np.array([0]))
    # the draft's top-1 probability on the true path is the recorded p0; past the recording, the request's mean
    assert oracle.chain_probs(0, 0, 3).tolist() == pytest.approx([0.9, 0.8, 0.3], abs=1e-6)
    assert oracle.chain_probs(2, 3, 2).tolist() == pytest.approx([0.7, 0.6], abs=1e-6)
    assert oracle.chain_probs(0, 5, 1).tolist() == pytest.approx([0.66], abs=1e-6)


def test_a_rank_past_the_width_is_a_miss_and_a_chain_run_replays_the_same(tmp_path: Path) -> None:
    oracle = _oracle(2)
    rows = {0: ([0, 40, 0, 0, 0, 0], [0.9] * 6)}
    oracle.use_trace(_recording(tmp_path / "r.parquet", rows=rows))
    assert oracle.score_chain(np.array([0]), np.array([0]), np.array([3]))[1:] == (np.array([1]), np.array([2]))
    # a chain of 2, step after step from position 0: accepts 1 (then the rank-40 miss), then from 2: 2, then from 5
    run = oracle.chain_run(np.array([0, 1]), np.array([0, 0]), 2, 3)
    assert run is not None
    accepted, matched = run
    assert accepted[:, 0].tolist() == [1, 2, 1] and matched[:, 0].tolist() == [1, 2, 1]


def test_a_requests_level_is_its_recorded_share_of_accepted_positions(tmp_path: Path) -> None:
    oracle = _oracle(3)
    rows = {0: ([0, 0, 1, 0], [0.9] * 4), 1: ([0] * 4, [0.9] * 4), 2: ([5] * 4, [0.1] * 4)}
    oracle.use_trace(_recording(tmp_path / "r.parquet", rows=rows))
    assert [oracle.level(r) for r in range(3)] == pytest.approx([0.75, 0.99, 0.01])  # clipped to [0.01, 0.99]


def test_a_recording_without_metadata_is_replayed_without_the_pairs_check_and_says_so(tmp_path: Path) -> None:
    oracle = _oracle()
    path = _recording(tmp_path / "r.parquet")
    oracle.use_trace(path, target="llama2-13b", output_len=np.array([5, 3, 5, 3]))
    assert oracle.notes == [f"oracle=trace: {path} carries no metadata (an older recording): its model pair is not "
                            "checked, and it covers the positions it recorded"]
    with pytest.raises(ValueError, match="request 1: 4 output tokens, recorded request 1 covers 3"):
        _oracle().use_trace(path, output_len=np.array([5, 4, 5, 3]))


@pytest.mark.parametrize(("kw", "message"), [
    ({"target": "llama2-13b"}, "oracle.path: {path} was recorded with target 'llama2-7b' (llama-160m/llama2-7b), not "
                               "this run's 'llama2-13b'"),
    ({"draft": "eagle"}, "oracle.path: {path} was recorded with draft 'llama-160m' (llama-160m/llama2-7b), not this "
                         "run's 'eagle'"),
    ({"output_len": np.array([5, 3, 6, 3])}, "oracle.path: 1 of the run's 4 requests run past the recording {path} "
     "(request 2: 6 output tokens, recorded request 0 covers 5): record the same workload, or "
     "oracle.past_recording=miss to count the positions past it as misses"),
    ({"past": "skip"}, "oracle.past_recording='skip': error | miss"),
])
def test_a_recording_that_does_not_fit_the_run_is_refused_in_one_line(tmp_path: Path, kw: dict[str, object],
                                                                      message: str) -> None:
    path = _recording(tmp_path / "r.parquet", META)
    with pytest.raises(ValueError) as err:
        _oracle().use_trace(path, **{"target": "llama2-7b", "draft": "llama-160m", **kw})  # type: ignore[arg-type]
    assert str(err.value) == message.format(path=path)


def test_past_its_end_a_recording_counts_misses_where_the_run_says_so(tmp_path: Path) -> None:
    path = _recording(tmp_path / "r.parquet", META)
    oracle = _oracle()
    oracle.use_trace(path, output_len=np.array([5, 3, 5, 3]))  # exactly what it covers: nothing to say
    assert oracle.notes == []
    oracle.use_trace(path, output_len=np.array([9, 3, 5, 4]), past="miss")
    assert oracle.notes == [f"oracle=trace: 2 of the run's 4 requests run past the recording {path} (request 0: 9 "
                            "output tokens, recorded request 0 covers 5); positions past it count as misses "
                            "(oracle.past_recording=miss)"]
    # what the metadata says a request was asked to cover counts, beyond its last recorded position
    wider = _recording(tmp_path / "w.parquet", {**META, "output_len": [8, 3]})
    _oracle().use_trace(wider, output_len=np.array([8, 3, 8, 3]))


def test_a_missing_empty_or_unreadable_recording_is_named(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"^oracle=trace needs oracle\.path=PATH: an acceptance recording "
                                                r"written by backend=hf backend\.record=PATH$"):
        _oracle().use_trace(None)
    gone = tmp_path / "gone.parquet"
    with pytest.raises(FileNotFoundError, match=f"^oracle.path: cannot read the acceptance recording '{gone}' "):
        _oracle().use_trace(gone)
    with pytest.raises(ValueError, match=r"^the acceptance recording is empty \(record a run that speculates\)$"):
        _oracle().use_trace(_recording(tmp_path / "e.parquet", rows={}))
