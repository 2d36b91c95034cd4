"""validate_vllm_v1's acceptance: vLLM's measured mean acceptance lengths per arm and k, reproduced by the oracle.

The committed curves (conf/oracle/vllm_v1_bench.yaml) are pinned to the data folder's
vllm_v1_bench/acceptance.csv when it is there; the oracle, built from the experiment's composed config, must emit
L(k) tokens per verify step at every k for every arm (here by the engine's own step path: a point at C = 1).
"""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest
import yaml

from repro.oracle.token_oracle import TokenOracle
from tests.conftest import data_root

CONF = Path(__file__).resolve().parents[1] / "conf" / "oracle" / "vllm_v1_bench.yaml"
LABEL = "sdb_instructcoder"
ARMS = {"Qwen/Qwen3-1.7B": ("accept", "qwen3-1.7b"), "Qwen/Qwen3-4B": ("accept", "qwen3-4b"),
        "RedHatAI/Qwen3-32B-speculator.eagle3": ("eagle_accept", None)}


def committed() -> dict[str, list[float]]:
    node = yaml.safe_load(CONF.read_text())
    out = {}
    for hf, (table, draft) in ARMS.items():
        entry = node[table][draft]["qwen3-32b"] if draft else node[table]["qwen3-32b"]
        out[hf] = [float(x) for x in entry[LABEL]]
    return out


def test_committed_curves_are_the_measured_ones() -> None:
    """The oracle's curves equal acceptance.csv's Qwen3-32B rows (k = 1..6 per arm), read when the data is here."""
    root = data_root()
    path = None if root is None else root / "vllm_v1_bench" / "acceptance.csv"
    if path is None or not path.is_file():
        pytest.skip("needs the data folder's vllm_v1_bench/acceptance.csv")
    measured: dict[str, dict[int, float]] = {}
    with path.open() as fh:
        for row in csv.DictReader(fh):
            if row["target"] == "Qwen/Qwen3-32B" and row["tp"] == "1":
                measured.setdefault(row["draft_model"], {})[int(row["num_spec_toks"])] = float(
                    row["acceptance_length"])
    curves = committed()
    assert set(measured) == set(curves)
    for hf, ks in measured.items():
        assert curves[hf] == [ks[k] for k in range(1, 7)], hf


@pytest.mark.parametrize("arm", list(ARMS))
def test_oracle_reproduces_each_arms_lengths_at_every_k(arm: str) -> None:
    """80,000 steps per k: the mean emitted per step within 4 standard errors (< 0.01) of L(k)."""
    curve = committed()[arm]
    table, _ = ARMS[arm]
    n, steps = 400, 200
    ds = np.array([LABEL] * n, dtype=object)
    if table == "accept":
        o = TokenOracle(0, ds, {LABEL: curve})
        proposer = "draft"
    else:
        o = TokenOracle(0, ds, {}, eagle_accept_mean={LABEL: curve})
        proposer = "eagle"
    for k in range(1, 7):
        acc, _ = o.chain_run(np.arange(n), np.zeros(n, dtype=np.int64), k, steps, proposer=proposer)
        emitted = acc + 1.0
        se = emitted.std() / np.sqrt(emitted.size)
        assert se < 0.01
        assert abs(emitted.mean() - curve[k - 1]) < 4 * se, (arm, k, emitted.mean(), curve[k - 1])


def test_one_point_reports_the_measured_length_and_vllms_kv_capacity(tmp_path: Path) -> None:
    """A whole point through the command line (EAGLE-3, k = 3, C = 4): vLLM's mean acceptance length within 3 % of
    the measured 2.177, and the KV capacity of the start-up accounting (tests/cost/test_startup_memory.py)."""
    import pandas as pd

    from repro.__main__ import main

    out = tmp_path / "run"
    main(["+exp=validate_vllm_v1", "case=eagle3", "k=3", "concurrency=4", f"out_dir={out}", "n_jobs=1"])
    row = pd.read_csv(out / "points.csv").iloc[0]
    assert row["method"] == "eagle3" and row["draft"] == "RedHatAI/Qwen3-32B-speculator.eagle3"
    assert row["k"] == 3 and row["concurrency"] == 4 and row["num_requests"] == 50
    assert abs(row["mean_acceptance_length"] - 2.177) < 0.03 * 2.177
    # ceil(0.9 x 93.115 GiB) - 61.02 GiB (Qwen3-32B) - 2.91 GiB (the head as vLLM loads it: 1.560 B params)
    # - 7.32 GiB (the sampler's and the rejection sampler's dummy runs over 1,024 rows of 151,936 logits, beside the
    # 8192-token pass's hidden states) - 0.2 GiB, over 16 x (262,144 + 4,096) B per block
    assert row["kv_cache_tokens"] == 49808
