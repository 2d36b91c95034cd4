"""``python -m repro sim_vs_real`` on this CPU: backend=hf's tiny models profiled, run for real, and simulated from
that profile with the real run's recorded acceptance. On a quiet machine the report's mean TPOT agrees within the
issue's 25 % for ``vllm`` and ``static_sd_k3`` (single-threaded; 2026-11-27 on this VM, eighteen runs: -23 % to
+16 % and -14 % to +8 %); beside a parallel test run this test holds it within 40 % (``CI_TOLERANCE``). Skipped
without PyTorch + transformers."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest

pytest.importorskip("torch", reason="sim_vs_real runs backend=hf: pip install torch==2.13.0 (CPU build)")
pytest.importorskip("transformers", reason="sim_vs_real runs backend=hf: pip install -e '.[real]'")

from repro.core.errors import ConfigError
from repro.experiments import sim_vs_real

# a fixed-length workload: nothing here reads the data folder (conftest.no_data), so CI's no-data pass skips it
pytestmark = pytest.mark.usefixtures("no_data")


def _tpot_errors(rows: pd.DataFrame) -> dict[str, float]:
    tpot = rows[rows["metric"] == "mean_tpot_ms"].set_index("system")
    assert (tpot["real"] > 0).all() and (tpot["simulated"] > 0).all()
    return {str(k): float(v) for k, v in (tpot["simulated"] / tpot["real"] - 1).items()}


#: What this test holds mean TPOT to. Both sides are wall-clock measurements, and beside a parallel test run another
#: process on the same cores slows the real run and not the profile measured before it, or the other way round: CI
#: saw -25 % to -37 % for static k = 3 in one run, where a quiet machine gives -14 % to +8 % (the command's own
#: tolerance, sim_vs_real.TOLERANCE, is 25 %); a full run without data, -49 % to +103 % in three tries. So it runs
#: alone (no other test beside it), and a plumbing fault is off by more in every try: the draft's table left out,
#: -52 % to -55 %; the analytic A100 model instead of the profile, -66 % to -73 %.
CI_TOLERANCE = 0.40


@pytest.mark.alone
def test_the_simulator_matches_backend_hf_on_this_cpu(tmp_path: Path) -> None:
    errors = []
    for attempt in range(3):  # up to three tries: a contended moment passes
        out = tmp_path / f"svr{attempt}"
        assert sim_vs_real.main(["--out", str(out), "--num-requests", "10", "--output-len", "32"]) == 0
        rows = pd.read_csv(out / "comparison.csv")
        assert set(rows["system"]) == {"vllm", "static_sd_k3"}
        errors.append(_tpot_errors(rows))
        if all(abs(e) <= CI_TOLERANCE for e in errors[-1].values()):
            break
    else:
        pytest.fail(f"mean TPOT errors beyond {CI_TOLERANCE:.0%} in three tries: {errors}")
    # the speculative system replayed the real run's acceptance: the same accepted length in both
    acc = rows[(rows["metric"] == "mean_accepted_len") & (rows["system"] == "static_sd_k3")].iloc[0]
    assert acc["real"] > 1 and math.isclose(acc["simulated"], acc["real"], rel_tol=1e-9)
    summary = (out / "summary.md").read_text()
    # the report's verdict against the command's 25 % (either way here: the run may have been contended)
    assert ("Mean TPOT agrees within" in summary) != ("beyond the 25% tolerance" in summary)
    assert "| static_sd_k3 | mean TPOT (ms) |" in summary
    assert (out / "sim_vs_real.png").stat().st_size > 0
    assert (out / "profile.csv").is_file() and (out / "profile.draft.csv").is_file()
    assert (out / "recording-static_sd_k3.parquet").is_file()


def test_a_stray_word_is_named() -> None:
    with pytest.raises(ConfigError, match="'oops' is neither a flag nor KEY=VALUE"):
        sim_vs_real.main(["oops"])


@pytest.mark.parametrize(("gpu", "overrides", "expected"), [
    ("NVIDIA H100 80GB HBM3", [], ["hardware=h100-80g"]),  # the first H100 run was refused: a100-80g by default
    ("NVIDIA H200", [], ["hardware=h200"]),
    ("NVIDIA H100 80GB HBM3", ["hardware=h100-80g"], []),  # the user's own choice stands
    (None, [], []),  # a CPU profile: no GPU to name
])
def test_both_runs_name_the_gpu_the_profile_was_measured_on(tmp_path: Path, gpu: str | None, overrides: list[str],
                                                            expected: list[str]) -> None:
    import json

    table = tmp_path / "profile.csv"
    (tmp_path / "profile.csv.json").write_text(json.dumps({"model": "llama2-7b", "gpu": gpu}))
    assert sim_vs_real._hardware_of(table, overrides) == expected
