"""GoodSpeed's claims (§IV-B Figs. 2-4) on the quick experiments (200 rounds), each with its tolerance.

What reproduces is asserted: the smoothed estimate tracks the realized goodput (Fig. 2), sending is a negligible
share of the wall time and receiving plus verifying dominate (Fig. 3), GoodSpeed ends above both baselines and much
closer to the optimum U(x*) than Fixed-S (Fig. 4). What does not is a strict xfail stating the reproduced value:
GoodSpeed's wall time is not comparable to Fixed-S's, and Random-S costs more than 25 % extra (Fig. 3): Eq. 5
maximizes tokens per round, not per second, and gives long chains to a few servers, whose sequential drafting on an
L4 then sets every round's length.
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
    # 200 rounds): U = 7.5 vs 6.9 (Fixed-S) and 4.3 (Random-S), gaps to U(x*) 0.36 vs 1.0 and 3.6. Tolerance:
    # above both, and at most half Fixed-S's gap.
    pts = quick_runs.get("goodspeed_fig4", data).points
    where = {"config": "Llama3 8 clients"}
    gs = point_value(pts, "goodspeed", "utility", **where)
    assert gs > point_value(pts, "fixed_s", "utility", **where)
    assert gs > point_value(pts, "random_s", "utility", **where)
    gap = point_value(pts, "goodspeed", "utility_gap", **where)
    assert gap <= 0.5 * point_value(pts, "fixed_s", "utility_gap", **where)


@pytest.mark.xfail(strict=True, reason="GoodSpeed's wall time is 1.8x Fixed-S's in the quick run (full run "
                   "1.6-1.8x; paper: comparable): Eq. 5 counts tokens per round, so it hands long chains to the "
                   "servers with the best acceptance, and the slowest server's sequential drafting on its L4 (plus "
                   "its distributions' uplink) sets the round")
def test_fig3_goodspeed_wall_time_comparable_to_fixed_s(fig3: pd.DataFrame) -> None:
    assert point_value(fig3, "goodspeed", "wall_vs_fixed") <= 1.05


@pytest.mark.xfail(strict=True, reason="Random-S takes 1.35-1.36x Fixed-S's wall time in the quick run (full run "
                   "1.36x; paper 1.05-1.25x): a uniformly random split often gives one server most of C")
def test_fig3_random_s_costs_5_to_25_percent_more(fig3: pd.DataFrame) -> None:
    assert 1.05 <= point_value(fig3, "random_s", "wall_vs_fixed") <= 1.25
