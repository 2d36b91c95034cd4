"""build_workload: determinism, classes, mixtures and switches, fallbacks, limits and the shipped configs.

Tests without ``real_data`` run on whatever data folder there is (real files, or none: the embedded tables).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from omegaconf import OmegaConf

from workloads.build import RequestTable, build_workload
from workloads.datasets import DataMissingError


def make_cfg(
    datasets: list[dict[str, Any]] | None = None, n: int = 200, rate: float = 4.0, **overrides: Any
) -> dict[str, Any]:
    """A plain-dict workload config with literal values."""
    cfg: dict[str, Any] = {
        "num_requests": n,
        "arrival": {"kind": "poisson", "rate_per_s": rate},
        "datasets": datasets if datasets is not None else [{"name": "sharegpt"}],
    }
    cfg.update(overrides)
    return cfg


def seed(s: int = 0) -> np.random.SeedSequence:
    return np.random.SeedSequence(s)


CONF = Path(__file__).resolve().parents[2] / "conf" / "workload"


def _same(a: RequestTable, b: RequestTable) -> bool:
    return (
        all(
            np.array_equal(getattr(a, f), getattr(b, f))
            for f in ("arrival_s", "prompt_len", "output_len", "dataset", "slo_class", "tpot_slo_s")
        )
        and a.source == b.source
    )


@pytest.mark.parametrize("source", ["auto", "embedded"])
def test_deterministic_per_seed(source: str) -> None:
    cfg = make_cfg([{"name": "sharegpt"}, {"name": "alpaca", "weight": 2.0}], source=source)
    a = build_workload(cfg, seed=seed(7), tokenizer="llama2")
    ss = seed(7)  # reusing one SeedSequence object gives the same table (its spawn counter is not advanced)
    assert _same(
        build_workload(cfg, seed=ss, tokenizer="llama2"), build_workload(cfg, seed=ss, tokenizer="llama2")
    )
    assert _same(a, build_workload(cfg, seed=seed(7), tokenizer="llama2"))
    assert not np.array_equal(a.arrival_s, build_workload(cfg, seed=seed(8), tokenizer="llama2").arrival_s)


def test_table_contract() -> None:
    t = build_workload(make_cfg(n=300), seed=seed(), tokenizer="llama3")
    assert len(t) == 300 and t.classes == ("default",)
    assert t.arrival_s.dtype == np.float64 and np.all(np.diff(t.arrival_s) >= 0)
    assert t.prompt_len.dtype == np.int64 and t.output_len.dtype == np.int64 and t.output_len.min() >= 1
    assert t.slo_class.dtype == np.int64 and np.all(t.slo_class == 0) and np.all(np.isinf(t.tpot_slo_s))
    assert set(t.dataset) == {"sharegpt"} and t.source == "; ".join(s.detail for s in t.provenance)


@pytest.mark.data("sharegpt/sharegpt_llama3_tokens_300b.jsonl")
def test_real_file_is_read_and_shown_under_repro_data(real_data: Path) -> None:
    t = build_workload(make_cfg(n=300), seed=seed(), tokenizer="llama3")
    assert "real file(s) $REPRO_DATA/sharegpt/sharegpt_llama3_tokens_300b.jsonl" in t.source
    assert str(real_data) not in t.source


def test_class_proportions_and_slos() -> None:
    cfg = make_cfg(
        n=1000,
        datasets=None,
        slo_classes={
            "urgent": {"proportion": 0.6, "tpot_slo_x_baseline": 1.0, "datasets": [{"name": "alpaca"}]},
            "search": {"tpot_slo_ms": 30.0, "datasets": [{"name": "arxiv"}]},
            "chat": {"tpot_slo_ms": 100.0, "datasets": [{"name": "alpaca"}]},
        },
    )
    del cfg["datasets"]
    t = build_workload(cfg, seed=seed(), tokenizer="llama2", baseline_tpot_s=0.0125)
    assert t.classes == ("urgent", "search", "chat")
    np.testing.assert_array_equal(
        np.bincount(t.slo_class), [600, 200, 200]
    )  # rest split equally, exact counts
    np.testing.assert_allclose(np.unique(t.tpot_slo_s), [0.0125, 0.030, 0.100])
    assert set(t.dataset[t.slo_class == 1]) == {"arxiv"} and set(t.dataset[t.slo_class != 1]) == {"alpaca"}
    with pytest.raises(ValueError, match="baseline"):
        build_workload(cfg, seed=seed(), tokenizer="llama2")


def test_mixture_weights() -> None:
    t = build_workload(
        make_cfg([{"name": "gsm8k", "weight": 3}, {"name": "mbpp", "weight": 1}], n=2000),
        seed=seed(),
        tokenizer="qwen",
    )
    assert np.mean(t.dataset == "gsm8k") == pytest.approx(0.75, abs=0.04)


def test_dataset_switch_by_time_and_fraction() -> None:
    phases = [
        {"start_s": 0.0, "datasets": [{"name": "sonnet"}]},
        {"start_s": 20.0, "datasets": [{"name": "sharegpt"}]},
    ]
    t = build_workload(
        make_cfg(None, n=200, phases=phases) | {"datasets": []}, seed=seed(), tokenizer="llama2"
    )
    assert set(t.dataset[t.arrival_s < 20]) == {"sonnet"} and set(t.dataset[t.arrival_s >= 20]) == {
        "sharegpt"
    }
    phases = [
        {"start_fraction": 0.0, "datasets": [{"name": "mbpp"}]},
        {"start_fraction": 0.5, "datasets": [{"name": "spider"}]},
    ]
    t = build_workload(
        make_cfg(None, n=100, phases=phases) | {"datasets": []}, seed=seed(), tokenizer="llama2"
    )
    assert list(t.dataset[:50]) == ["mbpp"] * 50 and list(t.dataset[50:]) == ["spider"] * 50


def test_embedded_fallback_with_empty_data_dir(empty_data: Path) -> None:
    t = build_workload(
        make_cfg([{"name": "sharegpt"}, {"name": "sonnet"}, {"name": "cnn_dailymail"}]),
        seed=seed(),
        tokenizer="llama2",
    )
    assert len(t) == 200 and "embedded" in t.source and "real file" not in t.source
    with pytest.raises(FileNotFoundError, match="sharegpt"):
        build_workload(make_cfg(source="real"), seed=seed(), tokenizer="llama2")


def test_published_source(empty_data: Path) -> None:
    t = build_workload(
        make_cfg([{"name": "cnn_dailymail", "published_target": "13b"}], n=4000, source="published"),
        seed=seed(),
        tokenizer="llama2",
    )
    assert t.prompt_len.mean() == pytest.approx(1067, rel=0.05) and t.output_len.mean() == pytest.approx(
        94, rel=0.05
    )
    assert "TurboSpec Table 2" in t.source


@pytest.mark.parametrize(("name", "prompt", "output", "hub_id"), [
    ("instructcode", 230, 200, "likaixin/InstructCoder"),
    ("chatbot_instruction_prompts", 40, 160, "alespalla/chatbot_instruction_prompts"),  # LAPS-SD's hub-only sets
    ("minithinky", 110, 650, "ngxson/MiniThinky-dataset"),
])
def test_assumed_lengths_without_a_file(empty_data: Path, tmp_path: Path, name: str, prompt: float, output: float,
                                        hub_id: str) -> None:
    t = build_workload(make_cfg([{"name": name}], n=4000), seed=seed(), tokenizer="llama2")
    assert t.prompt_len.mean() == pytest.approx(prompt, rel=0.05) and t.output_len.mean() == pytest.approx(
        output, rel=0.05
    )
    assert "ASSUMED" in t.source
    with pytest.raises(FileNotFoundError, match=hub_id):
        build_workload(make_cfg([{"name": name}], source="real"), seed=seed(), tokenizer="llama2")


@pytest.mark.parametrize("policy", ["filter", "truncate"])
def test_max_model_len(policy: str) -> None:
    t = build_workload(
        make_cfg([{"name": "arxiv"}], n=300, overlength=policy),
        seed=seed(),
        tokenizer="llama2",
        max_model_len=2048,
    )
    assert np.all(t.prompt_len + t.output_len <= 2048) and len(t) == 300 and t.output_len.min() >= 1


@pytest.mark.parametrize("policy", ["filter", "truncate"])
def test_outputs_to_max_model_len(policy: str) -> None:
    # vLLM with ignore_eos and no max_tokens (Nightjar Tables 4-5): every request runs to max_model_len; the
    # prompts are the dataset's (arxiv's run past 2,048 tokens: redrawn or cut)
    base = build_workload(make_cfg([{"name": "arxiv"}], n=300), seed=seed(), tokenizer="llama2")
    t = build_workload(make_cfg([{"name": "arxiv"}], n=300, overlength=policy, output_to_max_len=True),
                       seed=seed(), tokenizer="llama2", max_model_len=2048)
    assert np.all(t.prompt_len + t.output_len == 2048) and t.output_len.min() >= 1 and len(t) == 300
    assert (base.prompt_len >= 2048).any()
    if policy == "filter":  # the prompts that fit: outputs far above the dataset's own
        assert t.output_len.mean() > 2 * base.output_len.mean() and t.prompt_len.max() < 2048
    else:  # cut to 2,047 prompt tokens and one output token
        assert t.prompt_len.max() == 2047 and t.output_len.min() == 1
    assert "outputs run to max_model_len = 2048" in t.source
    with pytest.raises(ValueError, match="max_model_len"):
        build_workload(make_cfg([{"name": "arxiv"}], output_to_max_len=True), seed=seed(), tokenizer="llama2")


@pytest.mark.data("adaserve_artifact/fig10_emission_rps4.0_prop0.5.json", "traces/azure2023_code.csv")
def test_trace_replay_with_lengths_and_slos(real_data: Path) -> None:
    cfg = make_cfg(
        [{"name": "trace"}],
        n=500,
        arrival={"kind": "trace", "trace": "adaserve_fig10_emission_rps4.0_prop0.5"},
        trace_slo=True,
    )
    t = build_workload(cfg, seed=seed(), baseline_tpot_s=0.05)
    assert t.classes == ("x1.2", "50ms", "150ms") and np.all(t.output_len == 256)
    np.testing.assert_allclose(np.unique(t.tpot_slo_s), [0.05, 0.06, 0.15])
    cfg = make_cfg(
        [{"name": "trace"}], n=400, arrival={"kind": "trace", "trace": "azure2023_code", "rate_per_s": 3.0}
    )
    t = build_workload(cfg, seed=seed())
    assert (len(t) - 1) / (t.arrival_s[-1] - t.arrival_s[0]) == pytest.approx(3.0, rel=1e-6)


def test_unknown_keys_are_named() -> None:
    with pytest.raises(ValueError, match="rps_typo"):
        build_workload(make_cfg(rps_typo=1), seed=seed())
    with pytest.raises(ValueError, match="weigth"):
        build_workload(make_cfg([{"name": "alpaca", "weigth": 1}]), seed=seed())
    with pytest.raises(ValueError, match="unknown dataset"):
        build_workload(make_cfg([{"name": "nope"}]), seed=seed())


@pytest.mark.parametrize("data", ["ambient", "empty"])
@pytest.mark.parametrize("path", sorted(CONF.glob("*.yaml")), ids=lambda p: p.stem)
def test_shipped_configs_build(path: Path, data: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # "ambient": the data folder there is; "empty": no data, every loader on its embedded fallback
    if data == "empty":
        monkeypatch.setenv("REPRO_DATA", str(tmp_path))
    # dataset: the league's workload reads its experiment's (conf/exp/league.yaml sets it per scenario)
    root = OmegaConf.create({"num_requests": 60, "rps": 2.0, "load_scale": 1.0, "dataset": "sharegpt",
                             "workload": OmegaConf.load(path)})
    if path.stem == "trace_file":
        trace = tmp_path / "trace.csv"
        trace.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n0.0,10,5\n0.5,20,6\n1.5,30,7\n")
        root.workload.path = str(trace)
    t = build_workload(
        root.workload, seed=seed(), tokenizer="llama2", max_model_len=4096, baseline_tpot_s=0.0125
    )
    assert 0 < len(t) <= 60 and t.output_len.min() >= 1 and np.all(np.diff(t.arrival_s) >= 0)
    assert t.source


@pytest.mark.parametrize("trace", ["azure2023_conv", "mooncake"])
def test_trace_arrivals_fall_back_to_embedded_gaps(empty_data: Path, trace: str) -> None:
    # no trace file: i.i.d. gaps from the committed quantiles of the trace's inter-arrival times, at the target rate
    cfg = make_cfg([{"name": "alpaca"}], n=4000, arrival={"kind": "trace", "trace": trace, "rate_per_s": 2.0})
    t = build_workload(cfg, seed=seed(), tokenizer="llama2")
    assert "embedded inter-arrival quantiles" in t.source and t.arrival_s[0] == 0.0
    assert np.all(np.diff(t.arrival_s) >= 0)
    assert (len(t) - 1) / t.arrival_s[-1] == pytest.approx(2.0, rel=0.1)
    with pytest.raises(DataMissingError):
        build_workload({**cfg, "source": "real"}, seed=seed(), tokenizer="llama2")
