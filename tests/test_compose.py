"""The fast point composer (:class:`repro.experiments.compose.Composer`) gives every point exactly the config Hydra
composes for the same overrides (without the ``exp`` block, which points never read): same values, same interpolations,
same config hash, same one-line errors. Checked on points of every experiment."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import pytest
from omegaconf import DictConfig, OmegaConf

from repro.core.errors import ConfigError
from repro.experiments.compose import Composer, Recipe, as_config, compose_config, hydra_context, to_dict
from repro.experiments.results import config_hash, dict_hash
from tests.conftest import exp_points

EXPERIMENTS = sorted(p.stem for p in (Path(__file__).resolve().parents[1] / "conf" / "exp").glob("*.yaml"))


def _same(composer: Composer, overrides: list[str], ref: DictConfig | None = None) -> None:
    """``composer``'s config for ``overrides`` is Hydra's (``ref``, composed here if not given) without exp."""
    ref = compose_config(overrides) if ref is None else ref
    got = composer(overrides)
    want = OmegaConf.to_container(ref, resolve=False)
    assert isinstance(want, dict)
    want.pop("exp")
    assert OmegaConf.to_container(got, resolve=False) == want, overrides  # interpolations as written
    assert config_hash(got) == config_hash(ref), overrides  # and as resolved
    # to_dict's own walk resolves as OmegaConf's does: the same values of the same types
    assert repr(to_dict(got)) == repr(OmegaConf.to_container(got, resolve=True)), overrides
    assert OmegaConf.is_struct(got) and "exp" not in got


@pytest.mark.slow
@pytest.mark.parametrize("exp", EXPERIMENTS)
def test_every_experiments_points_compose_as_hydra_composes_them(exp: str) -> None:
    with hydra_context():
        spec, points = exp_points(exp)
        if spec.kind != "sweep":
            return
        picked = {0: points[0], len(points) - 1: points[-1], len(points) // 2: points[len(points) // 2]}.values()
        line = [f"+exp={exp}", "num_requests=7"]
        refs = [([*line, *p.overrides], compose_config([*line, *p.overrides])) for p in picked]
        composer = Composer()  # as repro check and repro all compose them
        for overrides, ref in refs:
            _same(composer, overrides, ref)
        _same_planned(composer, [o for o, _ in refs])
        # as a run from the command line composes them: the command line first (its config keeps the exp block),
        # then the points, which reuse its composition where their config groups choose what it chose
        composer = Composer()
        assert to_dict(composer(line, keep_exp=True)) == to_dict(compose_config(line))
        for overrides, ref in refs:
            _same(composer, overrides, ref)


def _same_planned(composer: Composer, lines: list[list[str]]) -> None:
    """Composer.planned: each point resolves as its own composition does, its recipe builds that config, and the
    live copies it resolved on are left as composed (their pickles unchanged)."""
    for overrides in lines:
        cfg, resolved = composer.planned(overrides)
        want = to_dict(composer(overrides))
        assert resolved == want, overrides
        assert to_dict(as_config(cfg)) == want, overrides
        assert config_hash(as_config(cfg)) == dict_hash(resolved)
    for base, live in composer._live.items():
        assert pickle.dumps(live) == base


def test_planned_points_resolve_as_composed_and_leave_nothing_changed() -> None:
    with hydra_context():
        composer = Composer()
        lines = [["+exp=smoke", *o] for o in (
            ["rps=1.0"], ["rps=2.0", "seed=3"], ["system=static_sd_k3", "system.k=5"], ["system=static_sd_k3"],
            ["rps=${num_requests}"], ["+extra_knob=3"], ["engine.block_size=32", "rps=4", "rps=5"],
            ["workload.arrival={kind:poisson,rate_per_s:3}"], ["system=adaserve", "system.w_max=2"])]
        _same_planned(composer, lines)
        kinds = [type(composer.planned(o)[0]).__name__ for o in lines]
        assert kinds.count("Recipe") == 7  # an addition and a node replaced: the config itself
        with pytest.raises(ConfigError, match="kk"):
            composer.planned(["+exp=smoke", "rps=3", "system.kk=5"])
        with pytest.raises(Exception, match="nope"):  # resolved on the live copy, and failing there
            composer.planned(["+exp=smoke", "seed=4", "rps=${nope}"])
        _same_planned(composer, lines[:2])  # (a failed point restores what it changed too)
        recipe = composer.planned(["+exp=smoke", "rps=7"])[0]
        assert isinstance(recipe, Recipe)
        assert to_dict(pickle.loads(pickle.dumps(recipe)).config()) == to_dict(recipe.config())


def test_a_cached_composition_is_never_shared_between_points() -> None:
    with hydra_context():
        composer = Composer()
        a = composer(["+exp=smoke", "rps=1.0"])
        b = composer(["+exp=smoke", "rps=2.0"])
        a.workload.num_requests = 3
        assert (a.rps, b.rps) == (1.0, 2.0) and b.workload.num_requests == 200
        assert b.workload.arrival.rate_per_s == 2.0  # ${rps} resolves against the point's own root
        _same(composer, ["+exp=smoke", "system=static_sd_k3", "system.k=5", "model@draft=vicuna-160m"])
        _same(composer, ["+exp=smoke", "+extra_knob=3", "engine.block_size=32"])
        assert len(composer._cache) == 2  # one Hydra composition per choice of config groups


@pytest.mark.parametrize("bad", ["system.kk=5", "num_request=5", "rps=[1,2", "draft=vicuna-160m"])
def test_mistakes_are_the_same_one_line_errors(bad: str) -> None:
    with hydra_context():
        with pytest.raises(ConfigError) as ref:
            compose_config(["+exp=smoke", bad])
        with pytest.raises(ConfigError) as got:
            Composer()(["+exp=smoke", bad])
    assert str(got.value) == str(ref.value)


def test_a_group_set_to_the_option_it_has_reuses_the_composition() -> None:
    with hydra_context():
        composer = Composer()
        composer(["+exp=smoke", "rps=1.0"], keep_exp=True)
        # smoke runs on the A100 (its own defaults) with vLLM (the main config's): choosing them again is no change
        _same(composer, ["+exp=smoke", "rps=1.0", "system=vllm", "hardware=a100-80g", "model@draft=llama-160m"])
        assert len(composer._cache) == 2 and len({id(e) for e in composer._cache.values()}) == 1
        # another option is another composition
        _same(composer, ["+exp=smoke", "system=sarathi", "hardware=a100-80g"])
        _same(composer, ["+exp=smoke", "hardware=h100-80g", "system=vllm"])
        assert len({id(e) for e in composer._cache.values()}) == 3
        _same(composer, ["+exp=smoke", "system=vllm", "system=sarathi"])  # set twice: Hydra decides


def _plain(cfg: DictConfig) -> object:
    return OmegaConf.to_container(cfg, resolve=False)


def test_a_composition_kept_on_disk_equals_hydras_and_is_used(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The disk cache gives back exactly what Hydra composed (unresolved interpolations and struct mode included),
    and a second process would not call Hydra at all."""
    import repro.experiments.compose as compose_mod

    overrides = ["+exp=laps_fig5", "system=laps_sd", "num_requests=20"]
    monkeypatch.setenv("REPRO_COMPOSE_CACHE", "0")
    with hydra_context():
        plain = compose_config(overrides)
    monkeypatch.setenv("REPRO_COMPOSE_CACHE", str(tmp_path))
    with hydra_context():
        first = compose_config(overrides)
    assert len(list(tmp_path.glob("*.pkl"))) == 1

    def no_hydra(*args: object, **kwargs: object) -> None:
        raise AssertionError("Hydra was called for a kept composition")

    monkeypatch.setattr(compose_mod, "compose", no_hydra)
    with hydra_context():
        kept = compose_config(overrides)
    for cfg in (first, kept):
        assert _plain(cfg) == _plain(plain) and OmegaConf.is_struct(cfg) == OmegaConf.is_struct(plain)
        assert config_hash(cfg) == config_hash(plain)
    with pytest.raises(ConfigError, match="sytem"), hydra_context():  # a mistake is never kept: Hydra's error
        monkeypatch.undo()
        monkeypatch.setenv("REPRO_COMPOSE_CACHE", str(tmp_path))
        compose_config(["sytem=vllm"])


def test_an_edited_config_file_is_composed_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import shutil

    from repro.experiments.results import CONF_DIR

    conf = tmp_path / "conf"
    shutil.copytree(CONF_DIR, conf)
    monkeypatch.setenv("REPRO_COMPOSE_CACHE", str(tmp_path / "cache"))
    with hydra_context(conf):
        before = compose_config(["system=laps_sd"]).system.gamma
    path = conf / "system" / "laps_sd.yaml"
    path.write_text(path.read_text().replace("gamma: 5 ", "gamma: 7 "))
    with hydra_context(conf):
        after = compose_config(["system=laps_sd"]).system.gamma
    assert (before, after) == (5, 7)


def test_interpolations_parsed_once_resolve_each_time() -> None:
    """repro remembers OmegaConf's parse of each interpolation's text: a remembered parse still resolves to the
    values of the config at hand (the tree holds the text's structure only)."""
    from omegaconf import OmegaConf, base

    assert hasattr(base.parse, "cache_info")  # installed on import (OmegaConf 2.3)
    for scale, rate in ((1.0, 2.0), (3.0, 0.5), (2, 4)):
        cfg = OmegaConf.create({"load_scale": scale, "rate": rate, "seg": "${mul:${load_scale},${rate}}",
                                "both": "${rate}-${load_scale}", "same": "${eq:${rate},${load_scale}}"})
        got = OmegaConf.to_container(cfg, resolve=True)
        assert got["seg"] == float(scale) * float(rate)  # type: ignore[index]
        assert got["both"] == f"{rate}-{scale}"  # type: ignore[index]
        assert got["same"] is (str(rate) == str(scale))  # type: ignore[index]
    assert base.parse.cache_info().hits > 0  # type: ignore[attr-defined]


def test_to_dict_resolves_as_omegaconf_does() -> None:
    """:func:`repro.experiments.compose.to_dict`'s walk gives ``OmegaConf.to_container(resolve=True)`` exactly
    (values and their types, key order) over every kind of node, and OmegaConf's own errors where it cannot."""
    OmegaConf.register_new_resolver("test_twice", lambda x: 2 * x, replace=True)
    cfg = OmegaConf.create({
        "a": 1, "b": 1.0, "c": True, "d": None, "e": "???", "f": "${a}", "g": "${test_twice:${b}}",
        "h": {"x": [1, "${a}", {"y": "${...z}"}], "z": None}, "i": "${h}", "j": r"\${a}", "k": "price ${b} and ${a}",
        "l": [], "m": {}, "n": "${h.x}", "o": "text with $ and { }", 3: "an int key",
        "p": OmegaConf.create({"q": 2}), "r": "${oc.select:nope,7}"})
    cfg.s = OmegaConf.create(None)
    want = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(want, dict) and repr(to_dict(cfg)) == repr({str(k): v for k, v in want.items()})
    broken = OmegaConf.create({"a": "${nope}"})
    with pytest.raises(Exception, match="nope"):
        to_dict(broken)


def test_a_recipe_lent_on_the_live_copy_is_its_config_and_leaves_the_copy_as_composed() -> None:
    """``Recipe.applied`` (what a sweep's worker runs a point on) gives :meth:`Recipe.config`'s values, read-only
    while lent, and restores the live copy after, also after a point that failed; overrides that are not value
    changes get a config of their own; a run that writes its lent config is run again on a copy of its own."""
    from omegaconf.errors import ReadonlyConfigError

    from repro.experiments import compose, launch

    with hydra_context():
        composer = Composer()
        lines = [["+exp=smoke", *o] for o in (["rps=1.0"], ["rps=2.5", "seed=3"], ["system=static_sd_k3", "system.k=5"],
                                              ["engine.block_size=32", "rps=4", "rps=5"])]
        recipes = [composer.planned(o)[0] for o in lines]
    assert all(isinstance(r, Recipe) for r in recipes)
    for r in [*recipes, *recipes]:
        assert isinstance(r, Recipe)
        with r.applied() as cfg:
            assert to_dict(cfg) == to_dict(r.config()) and OmegaConf.is_readonly(cfg)
            with pytest.raises(ReadonlyConfigError):
                cfg.rps = 9.0
        assert pickle.dumps(compose._LIVE[r.base]) == r.base and not OmegaConf.is_readonly(compose._LIVE[r.base])
    bad = Recipe(recipes[0].base, ("rps=2.0", "system.nope=3"))
    with pytest.raises(ConfigError, match="nope"), bad.applied():
        pass
    assert pickle.dumps(compose._LIVE[bad.base]) == bad.base
    added = Recipe(recipes[0].base, ("+extra_knob=3",))
    with added.applied() as cfg:
        assert cfg.extra_knob == 3 and cfg is not compose._LIVE[added.base]

    seen: list[bool] = []

    def writes(cfg: DictConfig, latencies: bool) -> Any:
        seen.append(OmegaConf.is_readonly(cfg) is True)
        cfg.rps = 3.0  # (no run writes its config)
        raise AssertionError("unreachable: a fresh copy is writable") if seen[-1] else ConfigError("ran on a copy")

    from repro.experiments import simulate

    run_point = simulate.run_point
    simulate.run_point = writes
    try:
        with pytest.raises(ConfigError, match="ran on a copy"):
            launch.run_one(0, recipes[0], False)
    finally:
        simulate.run_point = run_point
    assert seen == [True, False] and pickle.dumps(compose._LIVE[recipes[0].base]) == recipes[0].base
