"""GoodSpeed's claims (§IV-B Figs. 2-4) on the quick experiments (200 rounds), each with its tolerance.

What reproduces is asserted: the smoothed estimate tracks the realized goodput (Fig. 2), sending is a negligible
share of the wall time and receiving plus verifying dominate (Fig. 3), GoodSpeed ends above both baselines and much
closer to the optimum U(x*) than Fixed-S (Fig. 4), also in the suite's case with measured acceptance, where an
even split is far from optimal. What does not is a strict xfail stating the reproduced value: GoodSpeed's wall time
is not comparable to Fixed-S's, at C = 20 Random-S is not 5-25 % slower (Fig. 3), and GoodSpeed's goodput per
second is below Fixed-S's (§I: substantial gains). The
mechanism behind the first is asserted too: GoodSpeed's allocation swings from round to round, so its longest chain
is longer than Fixed-S's, and every round waits for that server's sequential drafting.
"""

from __future__ import annotations

import pandas as pd
import pytest

from tests.conftest import QuickRuns, point_value

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def fig3(quick_runs: QuickRuns, data: str) -> pd.DataFrame:
    return quick_runs.get("goodspeed_fig3", data).points


def test_fig2_the_smoothed_estimate_tracks_the_real_goodput(quick_runs: QuickRuns, data: str) -> None:
    # Paper: "strong alignment" of estimated and real goodput. Quick run: the allocation's expected tokens at the
    # smoothed acceptances sum to within 1.4 % of the tokens emitted. Tolerance: 5 % per configuration.
    pts = quick_runs.get("goodspeed_fig2", data).points
    assert (pts["goodput_est_bias"].abs() <= 0.05).all(), pts[["config", "goodput_est_bias"]]


def test_fig3_sending_is_negligible_and_receiving_and_verifying_dominate(fig3: pd.DataFrame) -> None:
    # Paper: sending under 0.1 % of the wall time; receiving and verifying dominate. Quick run (Llama3, 8 clients,
    # a 0.2 ms round trip): sending 0.06 % for GoodSpeed, 0.07-0.08 % for Random-S and 0.11 % for Fixed-S, whose
    # rounds are the shortest; receiving + verifying above 99.8 %. Tolerance: the paper's bound for GoodSpeed,
    # 0.2 % for the baselines.
    assert point_value(fig3, "goodspeed", "send_share") < 0.001
    for system in ("goodspeed", "fixed_s", "random_s"):
        assert point_value(fig3, system, "send_share") < 0.002
        assert point_value(fig3, system, "receive_verify_share") > 0.99


def test_fig4_goodspeed_ends_above_both_baselines_and_nearer_the_optimum(quick_runs: QuickRuns, data: str) -> None:
    # Paper: GoodSpeed's utility rises and ends above Fixed-S and Random-S. Quick run (Llama3, 8 clients, C = 20,
    # 200 rounds): U = 7.54 vs 7.53 (Fixed-S spending all 20 tokens) and 4.3 (Random-S); gaps to U(x*) 0.36 vs 0.36
    # and 3.6. The assumed acceptance table makes an even split nearly optimal, so GoodSpeed's gain over a Fixed-S that
    # spends its whole budget is small (full run: 0.01-0.15); over the floor reading (16 of 20) it was 0.6-0.75.
    # Tolerance: above both, no farther from the optimum than Fixed-S (+0.05), far nearer than Random-S.
    pts = quick_runs.get("goodspeed_fig4", data).points
    where = {"config": "Llama3 8 clients"}
    gs = point_value(pts, "goodspeed", "utility", **where)
    assert gs > point_value(pts, "fixed_s", "utility", **where)
    assert gs > point_value(pts, "random_s", "utility", **where)
    gap = point_value(pts, "goodspeed", "utility_gap", **where)
    assert gap <= point_value(pts, "fixed_s", "utility_gap", **where) + 0.05
    assert gap <= 0.25 * point_value(pts, "random_s", "utility_gap", **where)


@pytest.mark.xfail(strict=True, reason="GoodSpeed's wall time is 1.33x Fixed-S's in the quick run (Llama3, C = 20; "
                   "full run 1.21-1.33x at C = 20, 1.39-1.56x at C = 16; paper: comparable): its allocation swings "
                   "from round to round, so each round waits for a longer chain's sequential drafting on an L4")
def test_fig3_goodspeed_wall_time_comparable_to_fixed_s(fig3: pd.DataFrame) -> None:
    assert point_value(fig3, "goodspeed", "wall_vs_fixed") <= 1.05


def test_fig3_goodspeeds_rounds_wait_for_a_longer_chain(fig3: pd.DataFrame) -> None:
    # The mechanism of the gap above: Fixed-S drafts ⌊20/8⌋ = 2 or 3 tokens a server (its longest chain: 3 every
    # round); GoodSpeed's longest chain averages 5.5 in the quick run (4.4-5.5 in the full one) although its mean
    # allocation is nearly even, and its round is that much longer. The floor reading of Fixed-S (16 of 20 tokens)
    # runs shorter rounds still.
    assert point_value(fig3, "fixed_s", "mean_longest_chain") == pytest.approx(3.0)
    assert point_value(fig3, "goodspeed", "mean_longest_chain") > 4.0
    assert point_value(fig3, "fixed_s_floor", "wall_vs_fixed") < 0.85


@pytest.mark.xfail(strict=True, reason="Random-S takes 0.97x Fixed-S's wall time in the quick run at C = 20 (full "
                   "run 0.99-1.03x; at C = 16 1.18-1.24x, which holds; paper 1.05-1.25x): its total is uniform on "
                   "0..C, so it drafts C / 2 a round on average against Fixed-S's C")
def test_fig3_random_s_costs_5_to_25_percent_more(fig3: pd.DataFrame) -> None:
    assert 1.05 <= point_value(fig3, "random_s", "wall_vs_fixed") <= 1.25


def test_fig4_measured_acceptance_leaves_room_to_adapt_and_goodspeed_takes_it(quick_runs: QuickRuns,
                                                                              data: str) -> None:
    # The suite's case: SpecDecode-Bench's measured acceptance (0.27-0.84 across the 8 clients) instead of the
    # assumed table. U(x*) − U(even split) is 0.25 there against 0.07 for Llama3's assumed table (quick run, C = 20;
    # full run 0.17-0.25 against 0.002-0.07), and GoodSpeed ends 0.21 above Fixed-S, half its gap to U(x*) (0.25
    # against 0.52; full run 0.14-0.16 against 0.29-0.39). Tolerance: headroom above 0.15 and at least twice
    # Llama3's; GoodSpeed above Fixed-S by 0.1 and at most 0.6 of its gap.
    pts = quick_runs.get("goodspeed_fig4", data).points
    measured, assumed = {"config": "Measured acceptance (suite's)"}, {"config": "Llama3 8 clients"}
    headroom = point_value(pts, "fixed_s", "even_gap", **measured)
    assert headroom > 0.15 and headroom > 2 * point_value(pts, "fixed_s", "even_gap", **assumed)
    gs, fixed = (point_value(pts, s, "utility", **measured) for s in ("goodspeed", "fixed_s"))
    assert gs > fixed + 0.1
    gaps = [point_value(pts, s, "utility_gap", **measured) for s in ("goodspeed", "fixed_s")]
    assert gaps[0] < 0.6 * gaps[1]


@pytest.mark.xfail(strict=True, reason="GoodSpeed delivers 0.76x Fixed-S's tokens per second in the quick run (Llama3, "
                   "C = 20; full run 0.64-0.85x over Table I's configurations, 0.69-0.80x with measured acceptance; "
                   "paper §I: substantial gains in system-wide goodput): about as many tokens a round, rounds "
                   "1.21-1.56x as long")
def test_goodspeed_gains_goodput_per_second_over_fixed_s(fig3: pd.DataFrame) -> None:
    assert point_value(fig3, "goodspeed", "goodput_vs_fixed") > 1.0
