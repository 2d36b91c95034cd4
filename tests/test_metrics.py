"""repro.metrics.summary on hand-computed request tables."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from repro.metrics.steps import regret, regret_from_arms
from repro.metrics.summary import (
    POINT_METRICS,
    RENAMED,
    attained,
    jain_index,
    per_class,
    sum_log,
    summarize,
    tpot_s,
)

# the subject does not depend on where the workload comes from: pinned to the embedded statistics
# (conftest.no_data), so CI's no-data pass need not repeat it
pytestmark = pytest.mark.usefixtures("no_data")

INF = math.inf
NAN = math.nan


def req(
    arrival: float = 0.0,
    first: float = 1.0,
    finish: float = 2.0,
    out: int = 11,
    tpot_slo: float = INF,
    ttft_slo: float = INF,
    cls: str = "default",
    proposed: int = 0,
    accepted: int = 0,
    decode_steps: int = 10,
    spec_steps: int = 0,
) -> dict[str, object]:
    """One request row as the engine writes it."""
    return {
        "rid": 0, "dataset": "d", "slo_class": cls, "arrival_s": arrival, "first_token_at": first,
        "finish_at": finish, "prompt_len": 5, "output_len": out, "num_proposed": proposed,
        "num_accepted": accepted, "num_decode_steps": decode_steps, "num_spec_steps": spec_steps,
        "tpot_slo_s": tpot_slo, "ttft_slo_s": ttft_slo, "num_preemptions": 0,
    }  # fmt: skip


def frame(*rows: dict[str, object]) -> pd.DataFrame:
    df = pd.DataFrame(list(rows))
    df["rid"] = np.arange(len(df))
    return df


@pytest.mark.parametrize(
    ("row", "expected"),
    [
        (req(), True),  # no SLO at all: a finished request attains
        (req(tpot_slo=0.1), True),  # TPOT = (2-1)/(11-1) = 0.1 ≤ 0.1 (boundary attains)
        (req(tpot_slo=0.099), False),  # 0.1 > 0.099
        (req(finish=NAN, tpot_slo=INF), False),  # unfinished = miss, even without SLO
        (req(out=1, finish=1.0, tpot_slo=0.001), True),  # single token: no TPOT, judged by TTFT only
        (req(out=1, finish=1.0, ttft_slo=0.5), False),  # single token, TTFT 1.0 > 0.5
        (req(tpot_slo=0.2, ttft_slo=0.5), False),  # TPOT fine, TTFT 1.0 > 0.5
        (req(tpot_slo=0.2, ttft_slo=1.0), True),  # both met
    ],
)
def test_attainment_per_request(row: dict[str, object], expected: bool) -> None:
    assert attained(frame(row))[0] == expected


def test_tpot_undefined_for_single_token_and_unfinished() -> None:
    t = tpot_s(frame(req(), req(out=1, finish=1.0), req(finish=NAN)))
    assert t[0] == pytest.approx(0.1)
    assert np.isnan(t[1]) and np.isnan(t[2])


def test_summarize_hand_computed() -> None:
    df = frame(
        # TPOT 0.1 s, meets 0.15; latency 2; TTFT 1
        req(arrival=0.0, first=1.0, finish=2.0, out=11, tpot_slo=0.15, cls="urgent",
            proposed=20, accepted=10, decode_steps=5, spec_steps=5),
        # TPOT 0.2 s, misses 0.15; latency 4; TTFT 2
        req(arrival=1.0, first=3.0, finish=5.0, out=11, tpot_slo=0.15, cls="urgent",
            proposed=20, accepted=5, decode_steps=5, spec_steps=5),
        # unfinished: 4 tokens so far, TTFT 0.5
        req(arrival=2.0, first=2.5, finish=NAN, out=4, cls="relaxed", decode_steps=3),
    )  # fmt: skip
    m = summarize(df, sim_time_s=10.0)
    assert set(POINT_METRICS) <= set(m)
    assert m["num_requests"] == 3
    assert m["slo_attainment"] == pytest.approx(1 / 3)
    assert m["goodput_tok_s"] == pytest.approx(11 / 10)  # only the first request's tokens
    assert m["output_throughput"] == pytest.approx(26 / 10)
    assert m["request_throughput"] == pytest.approx(2 / 10)
    assert m["mean_latency_s"] == pytest.approx(3.0)
    assert m["median_latency_s"] == pytest.approx(3.0)
    assert m["mean_ttft_ms"] == pytest.approx((1000 + 2000 + 500) / 3)
    assert m["mean_tpot_ms"] == pytest.approx(150.0)
    assert m["acceptance_rate"] == pytest.approx(15 / 40)
    assert m["mean_accepted_len"] == pytest.approx((15 + 13) / 13)  # (accepted + decode steps) / decode steps
    assert m["mean_acceptance_length"] == pytest.approx(1 + 15 / 10)  # vLLM: 1 + accepted / drafts
    assert m["slo_attainment_urgent"] == pytest.approx(0.5)
    assert m["slo_attainment_relaxed"] == 0.0
    assert m["completed"] == 2
    assert m["sim_time_s"] == 10.0


def test_no_speculation_gives_nan_acceptance_and_unit_length() -> None:
    m = summarize(frame(req(), req()), sim_time_s=5.0)
    assert math.isnan(m["acceptance_rate"])
    assert m["mean_accepted_len"] == 1.0


def test_mean_batch_size_from_steps_counts_or_littles_law() -> None:
    df = frame(req(first=0.0, finish=4.0), req(first=2.0, finish=4.0))
    assert summarize(df, 4.0)["mean_batch_size"] == pytest.approx((4 + 2) / 4)  # a live server: no steps
    assert summarize(df, 4.0, batched=(4, 5))["mean_batch_size"] == pytest.approx(5 / 4)
    steps = pd.DataFrame({"num_seqs": [1, 2, 3], "latency_s": [0.1, 0.1, 0.2]})
    m = summarize(df, 4.0, steps)
    assert m["mean_batch_size"] == pytest.approx(2.0)
    assert m["busy_time_s"] == pytest.approx(0.4)


@pytest.mark.parametrize(
    ("system", "batch"),
    [
        ("laps_sd", 1.0),  # one request per step: its others wait preempted (Little's law counted them: ~67)
        ("lp_sjf", 1.0),
        ("vllm", None),  # continuous batching, admitting inside fast-forwarded runs
        ("static_sd_k3", None),
    ],
)
def test_mean_batch_size_is_the_requests_each_step_runs(system: str, batch: float | None) -> None:
    from repro.experiments.simulate import compose, run_point

    base = [f"system={system}", "num_requests=30", "rps=8"]
    plain = run_point(compose(base)).metrics["mean_batch_size"]
    traced = run_point(compose([*base, "engine.record_steps=true"]))
    assert traced.steps is not None
    assert plain == traced.metrics["mean_batch_size"] == traced.steps["num_seqs"].mean()  # counts = the trace
    if batch is not None:
        assert plain == batch
    else:
        assert plain > 4.0


def test_empty_table_is_nan_not_error() -> None:
    m = summarize(frame(req()).iloc[:0], sim_time_s=0.0)
    assert m["num_requests"] == 0 and math.isnan(m["slo_attainment"])


def test_per_class() -> None:
    df = frame(req(cls="a", tpot_slo=0.05), req(cls="a"), req(cls="b"))
    pc = per_class(df, sim_time_s=2.0)
    assert pc.loc["a", "slo_attainment"] == 0.5 and pc.loc["b", "slo_attainment"] == 1.0
    assert pc.loc["a", "goodput_tok_s"] == pytest.approx(11 / 2)


@pytest.mark.parametrize(
    ("x", "expected"),
    [
        ([1.0, 1.0, 1.0, 1.0], 1.0),  # all equal
        ([1.0, 0.0, 0.0, 0.0], 0.25),  # one client gets everything: 1/n
        ([1.0, 2.0], 9 / 10),  # (3)^2 / (2 * 5)
        ([0.0, 0.0], 1.0),  # nobody got anything: equal
    ],
)
def test_jain_index(x: list[float], expected: float) -> None:
    assert jain_index(x) == pytest.approx(expected)


def test_fairness_extras_with_clients() -> None:
    df = frame(req(out=10), req(out=30))
    df["client"] = ["c0", "c1"]
    m = summarize(df, sim_time_s=10.0)
    assert m["jain_index"] == pytest.approx(jain_index([1.0, 3.0]))
    assert m["sum_log_goodput"] == pytest.approx(math.log(1.0) + math.log(3.0))
    assert sum_log([1.0, 0.0]) == -INF


def test_regret() -> None:
    assert regret([1, 0, 1], [1, 1, 1]).tolist() == [0, 1, 1]
    rewards = np.array([[1.0, 0.0], [1.0, 0.5], [0.0, 1.0]])  # arm 0 totals 2, arm 1 totals 1.5
    assert regret_from_arms(rewards, [1, 1, 0]).tolist() == [1.0, 1.5, 1.5]


def test_summarize_is_fast_enough_shape() -> None:
    """10k requests summarize without Python loops (the speed itself is a tests/bench concern)."""
    n = 10_000
    rng = np.random.default_rng(0)
    arrival = np.sort(rng.uniform(0, 100, n))
    df = pd.DataFrame(
        {
            "slo_class": rng.choice(["urgent", "relaxed"], n), "arrival_s": arrival,
            "first_token_at": arrival + 0.1, "finish_at": arrival + 2.0,
            "output_len": rng.integers(1, 200, n),
            "num_proposed": 10, "num_accepted": 5, "num_decode_steps": 4, "num_spec_steps": 4,
            "tpot_slo_s": 0.05, "ttft_slo_s": INF, "prompt_len": 10, "num_preemptions": 0,
        }
    )  # fmt: skip
    m = summarize(df, 110.0)
    assert m["num_requests"] == n and 0 <= m["slo_attainment"] <= 1


class PatternOracle:
    """Test double: request r's proposed tokens match the target exactly where ``pattern[r][position]`` is 1."""

    def __init__(self, pattern: dict[int, list[int]]) -> None:
        self.pattern = pattern

    def score_chain(self, rids: np.ndarray, pos: np.ndarray, k: np.ndarray,
                    proposer: str = "draft") -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        hits = [np.array(self.pattern[int(r)][int(p):int(p) + int(n)], dtype=bool)
                for r, p, n in zip(rids, pos, k, strict=True)]
        accepted = np.array([int(np.argmin(np.append(h, False))) for h in hits])
        return np.asarray(k, dtype=np.int64).copy(), accepted, np.array([int(h.sum()) for h in hits])

    def chain_run(self, rids: np.ndarray, pos: np.ndarray, k: int, steps: int, proposer: str = "draft", *,
                  end: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        from tests.conftest import chain_run_by_steps

        return chain_run_by_steps(self, rids, pos, k, steps, proposer)

    def release(self, rid: int) -> None:
        pass


def test_acceptance_metric_definitions_on_a_hand_made_pattern() -> None:
    # One decode step each (after the prefill's first token, positions 1-4), k = 4. Request 0 matches at the
    # 1st, 3rd and 4th proposed position (pattern 1 0 1 1): the chain accepts 1
    # token, 3 of its 4 tokens are the target's. Request 1 matches all 4. So acceptance_rate (emitted fraction)
    # = (1 + 4) / 8 = 0.625 and vLLM v0's draft_acceptance_rate (matched / proposed) = (3 + 4) / 8 = 0.875.
    from repro.experiments.simulate import requests_frame
    from systems.static_sd import StaticSD
    from tests.conftest import make_engine, make_requests

    oracle = PatternOracle({0: [0, 1, 0, 1, 1, 0], 1: [0, 1, 1, 1, 1, 1]})
    out = make_engine(StaticSD(k=4), make_requests(2, output_len=2), oracle=oracle, record_steps=True).run()
    table = type("T", (), {"dataset": np.array(["x", "x"]), "classes": ("default",), "slo_class": [0, 0]})()
    m = summarize(requests_frame(out, table), out.sim_time_s)
    assert m["acceptance_rate"] == pytest.approx(5 / 8)
    assert m["draft_acceptance_rate"] == pytest.approx(7 / 8)
    step = next(r for r in out.steps if r.num_proposed)
    assert (step.num_proposed, step.num_accepted, step.num_matched) == (8, 5, 7)


def test_tpot_from_the_first_decode_step() -> None:
    # the first token at 1.0 s, the first decode step starts at 1.5 s (a prefill of another request ran between),
    # 5 tokens, finish at 3.5 s: vLLM's TPOT = 2.5 / 4, the authors' = 2.0 / 4; SLO 0.55 s splits them
    row = pd.DataFrame({"arrival_s": [0.0], "first_token_at": [1.0], "first_decode_at": [1.5], "finish_at": [3.5],
                        "output_len": [5], "tpot_slo_s": [0.55]})
    assert tpot_s(row)[0] == pytest.approx(0.625) and tpot_s(row, "first_decode_at")[0] == pytest.approx(0.5)
    m = summarize(row, 3.5)
    assert m["slo_attainment"] == 0.0 and m["slo_attainment_from_decode"] == 1.0
    assert m["mean_tpot_from_decode_ms"] == pytest.approx(500.0)


def test_switch_overhead_and_estimate_error_by_hand() -> None:
    # LAPS-SD Figs. 2 and 7: Σ swap / Σ service; |estimate − service| / service over finished requests with an
    # estimate, and the share of finished requests that have one.
    req = pd.DataFrame({"rid": [0, 1, 2, 3], "arrival_s": [0.0] * 4, "first_token_at": [0.1] * 4,
                        "finish_at": [2.0, 3.0, 4.0, np.nan], "output_len": [10] * 4, "service_s": [2.0, 2.0, 4.0, 1.0],
                        "swap_s": [0.5, 0.0, 0.5, 0.0], "estimate_s": [2.2, 1.0, np.nan, 3.0]})
    m = summarize(req, 4.0)
    assert m["switch_overhead"] == pytest.approx(1.0 / 9.0)
    assert m["mean_estimate_error"] == pytest.approx((0.1 + 0.5) / 2)
    assert m["estimated_fraction"] == pytest.approx(2 / 3)
    assert "mean_estimate_error" not in summarize(req.drop(columns="estimate_s"), 4.0)
    # when LAPS-SD judged them stable: medians over the requests that were (NaN: never)
    req = req.assign(stable_rounds=[10.0, 4.0, np.nan, 30.0], stable_tokens=[20.0, 9.0, np.nan, 61.0])
    m = summarize(req, 4.0)
    assert m["median_stable_rounds"] == 10.0 and m["median_stable_tokens"] == 20.0
    assert "median_stable_rounds" not in summarize(req.drop(columns=["stable_rounds", "stable_tokens"]), 4.0)


def test_one_name_per_metric() -> None:
    """Every metric has one name, vLLM's where vLLM has it: no name of the previous release (``RENAMED``, which
    ``repro check`` still reads) is produced, and every renamed metric is produced under its new name."""
    df = frame(req(out=10), req(out=30))
    df["client"] = ["c0", "c1"]
    m = summarize(df, sim_time_s=10.0)
    assert not set(RENAMED) & set(m) and not set(RENAMED) & set(POINT_METRICS)
    assert set(RENAMED.values()) - {"median_itl_ms", "median_e2el_ms"} <= set(m)  # those two: backend=openai's
    assert m["median_latency_s"] == m["mean_latency_s"] and m["output_throughput"] == 4.0


def test_summary_reads_each_column_once_and_leaves_the_frame_alone() -> None:
    """Within summarize a column is converted once (read-only, shared by its readers); outside, every call converts
    afresh; the frame's own columns stay writeable, and the same frame summarizes to the same metrics twice."""
    from repro.metrics import summary

    n = 40
    rng = np.random.default_rng(0)
    arrival = np.sort(rng.uniform(0, 10, n))
    frame = pd.DataFrame({
        "rid": np.arange(n), "slo_class": ["default"] * n, "arrival_s": arrival,
        "first_token_at": arrival + 0.1, "first_decode_at": arrival + 0.1, "finish_at": arrival + 2.0,
        "prompt_len": np.full(n, 30), "output_len": rng.integers(1, 50, n), "num_proposed": np.full(n, 8),
        "num_accepted": np.full(n, 5), "num_matched": np.full(n, 5), "num_decode_steps": np.full(n, 4),
        "num_spec_steps": np.full(n, 4), "tpot_slo_s": np.full(n, 0.05), "ttft_slo_s": np.full(n, 1.0),
        "num_preemptions": np.zeros(n, dtype=int), "service_s": np.full(n, 1.5), "swap_s": np.zeros(n)})
    first = summary.summarize(frame, 12.0)
    assert summary.summarize(frame, 12.0) == first
    assert summary._arr(frame, "finish_at") is not summary._arr(frame, "finish_at")  # no summary running
    frame.loc[0, "finish_at"] = 3.0  # the frame's columns stay writeable
    summary._READING.append((frame, {}))
    try:
        a = summary._arr(frame, "finish_at")
        assert summary._arr(frame, "finish_at") is a and not a.flags.writeable
        assert summary._arr(frame.copy(), "finish_at") is not a  # another frame: its own conversion
    finally:
        summary._READING.pop()
    with pytest.raises(TypeError):
        summary.summarize(frame, "x")  # type: ignore[arg-type]
    assert summary._READING == []  # released on an error too


def test_a_point_without_latency_columns_has_the_same_metrics() -> None:
    """run_point(latencies=False), a sweep's worker keeping no tables: the same metrics, the table without the
    derived latency columns (which with_latencies adds)."""
    from repro.experiments.simulate import compose, run_point
    from repro.metrics.summary import LATENCY_COLUMNS

    cfg = compose(["system=turbospec", "num_requests=30", "rps=8"])
    full, bare = run_point(cfg), run_point(cfg, latencies=False)
    assert {k: v for k, v in full.metrics.items() if k != "wall_s"} == \
        {k: v for k, v in bare.metrics.items() if k != "wall_s"}
    assert set(LATENCY_COLUMNS) <= set(full.requests.columns)
    assert not set(LATENCY_COLUMNS) & set(bare.requests.columns)


def _steps(**cols: list[float]) -> pd.DataFrame:
    return pd.DataFrame({k: np.asarray(v, dtype=np.float64) for k, v in cols.items()})


def test_the_iteration_breakdowns_are_over_the_steps_that_decode() -> None:
    from repro.metrics.steps import step_extras

    steps = _steps(num_decode=[0, 2, 2, 1], latency_s=[9.0, 0.010, 0.020, 0.030], draft_s=[9.0, 0.002, 0.004, 0.006],
                   verify_s=[9.0, 0.007, 0.014, 0.021], schedule_wall_s=[9.0, 0.001, 0.001, 0.004],
                   overhead_s=[9.0, 0.001, 0.002, 0.003], mean_k=[0.0, 2.0, 3.0, 4.0])
    x = step_extras(steps)
    assert x == pytest.approx({"mean_iter_ms": 20.0, "mean_iter_draft_ms": 4.0, "mean_iter_verify_ms": 14.0,
                               "mean_iter_schedule_ms": 2.0, "draft_share": 0.2, "overhead_share": 0.1,
                               "target_share": 0.7, "mean_proposed_len": 3.0}, rel=1e-12)
    assert set(step_extras(steps[["num_decode", "latency_s"]])) == {"mean_iter_ms"}  # what the columns allow
    idle = step_extras(steps.assign(latency_s=0.0))
    assert all(math.isnan(idle[k]) for k in ("draft_share", "overhead_share", "target_share"))
    assert math.isnan(step_extras(steps.iloc[:1])["mean_iter_ms"])  # no step decodes


def test_regret_per_decode_step_over_the_scored_steps() -> None:
    """Nightjar Eq. 2's regret over the steps with counterfactual rewards (best_reward set), its fixed-arm
    comparator, the share of steps that ran the best arm, the regret's share of the best rewards, and the growth
    exponent of R(T) from R(T) / R(T/2)."""
    from repro.metrics.steps import step_extras

    steps = _steps(num_decode=[1, 1, 1, 1, 1], best_reward=[3.0, 3.0, NAN, 3.0, 3.0], reward=[2.0, 3.0, 1.0, 2.0, 1.0],
                   cum_regret=[1.0, 1.0, NAN, 2.0, 4.0], cum_regret_fixed=[0.5, 1.0, NAN, 1.5, 2.0],
                   mean_k=[2.0, 3.0, 1.0, 2.0, 1.0], best_arm=[2.0, 2.0, NAN, 2.0, 2.0])
    x = step_extras(steps)
    assert {k: x[k] for k in ("regret", "regret_fixed", "regret_per_step", "best_arm_share", "regret_share",
                              "regret_exponent")} == pytest.approx(
        {"regret": 4.0, "regret_fixed": 2.0, "regret_per_step": 1.0, "best_arm_share": 0.5, "regret_share": 4 / 12,
         "regret_exponent": 1.0}, rel=1e-12)  # R(4) / R(2) = 2 / 1
    three = step_extras(steps.iloc[:4])  # three scored steps: too few for an exponent
    assert "regret_exponent" not in three and three["regret"] == 2.0
    flat = step_extras(steps.assign(cum_regret_fixed=[0.0, 0.0, NAN, 0.0, 0.0]))
    assert math.isnan(flat["regret_exponent"])  # no regret to grow
    dynamic = step_extras(steps.drop(columns="cum_regret_fixed"))
    assert "regret_fixed" not in dynamic and "regret_exponent" not in dynamic and dynamic["regret"] == 4.0
    none = step_extras(steps.assign(best_reward=NAN))
    assert all(math.isnan(none[k]) for k in ("regret", "regret_fixed", "regret_per_step", "best_arm_share",
                                              "regret_share"))


def test_a_rounds_wall_time_split_into_receiving_verifying_and_sending() -> None:
    """GoodSpeed Fig. 3: receiving (drafting and uplink), verifying and sending, their shares of the wall time and
    per emitted token, and the longest chain of each round that drafts."""
    from repro.metrics.steps import step_extras

    steps = _steps(draft_s=[0.01, 0.03], verify_s=[0.02, 0.02], send_s=[0.01, 0.01], latency_s=[0.04, 0.06],
                   num_emitted=[10.0, 10.0], S_0=[3.0, 0.0], S_1=[5.0, NAN], S_x=[99.0, 99.0])
    x = step_extras(steps)
    assert x == pytest.approx({"receive_time_s": 0.04, "verify_time_s": 0.04, "send_time_s": 0.02,
                               "send_share": 0.2, "receive_verify_share": 0.8, "wall_ms_per_token": 5.0,
                               "verify_ms_per_token": 2.0, "mean_longest_chain": 5.0}, rel=1e-12)
    assert "receive_time_s" not in step_extras(steps.assign(send_s=0.0))  # no round sends: not an edge run
    quiet = step_extras(steps.assign(latency_s=0.0, num_emitted=0.0, S_0=0.0, S_1=0.0))
    assert all(math.isnan(quiet[k]) for k in ("send_share", "receive_verify_share", "wall_ms_per_token",
                                               "verify_ms_per_token", "mean_longest_chain"))
    assert "mean_longest_chain" not in step_extras(steps.drop(columns=["S_0", "S_1"]))


def test_the_estimators_bias_and_the_memory_operations() -> None:
    from repro.metrics.steps import step_extras

    est = step_extras(_steps(goodput_est=[NAN, 6.0, 3.0], num_emitted=[100.0, 4.0, 6.0]))
    assert est == pytest.approx({"goodput_est_bias": 9 / 10 - 1})  # over the rounds that estimated
    assert math.isnan(step_extras(_steps(goodput_est=[NAN, 6.0], num_emitted=[5.0, 0.0]))["goodput_est_bias"])
    mem = step_extras(_steps(memory_op=[0.0, 1.0, 2.0, 1.0], memory_s=[0.5, 0.002, 0.004, 0.003]))
    assert mem == pytest.approx({"num_expand": 2.0, "mean_expand_ms": 2.5, "num_contract": 1.0,
                                 "mean_contract_ms": 4.0}, rel=1e-12)
    none = step_extras(_steps(memory_op=[0.0], memory_s=[0.0]))
    assert none["num_expand"] == 0.0 and math.isnan(none["mean_expand_ms"]) and math.isnan(none["mean_contract_ms"])


def test_a_steps_total_tokens_and_the_peak_rate_over_windows() -> None:
    from repro.metrics.steps import peak_token_rate, step_total_tokens

    # a prefill of 100 prompt tokens emitting 2 first tokens; a decode of 2 requests verifying 3 drafts each
    # (8 batched tokens) emitting 5; a decode emitting 2 of 2 batched
    steps = _steps(num_emitted=[2.0, 5.0, 2.0], num_batched_tokens=[100.0, 8.0, 2.0], num_decode=[0.0, 2.0, 2.0],
                   num_proposed=[0.0, 6.0, 0.0], start_at=[10.0, 10.5, 11.2])
    assert step_total_tokens(steps).tolist() == [102.0, 5.0, 2.0]
    assert peak_token_rate(steps, 1.0) == 107.0  # [10, 11): the first two steps
    assert peak_token_rate(steps, 0.5) == 204.0  # [10, 10.5): the prefill alone
    assert peak_token_rate(steps, 2.0) == pytest.approx(109 / 2.0)
    assert math.isnan(peak_token_rate(steps, 0.0)) and math.isnan(peak_token_rate(steps.iloc[:0], 1.0))


def test_per_client_is_per_group_by_client() -> None:
    from repro.metrics.summary import per_client, per_group

    reqs = frame(req(out=10), req(out=30), req(out=20))
    reqs["client"] = ["a", "b", "a"]
    got = per_client(reqs, 4.0)
    pd.testing.assert_frame_equal(got, per_group(reqs, "client", 4.0))
    assert got["num_requests"].tolist() == [2, 1] and "goodput_tok_s" in got.columns
