"""Open choices (exp.open): every paper experiment declares the values its paper leaves open, and each declaration
names a key its points have, at the value they run (repro.experiments.openchoices)."""

from __future__ import annotations

import math
from typing import Any

import pytest
from omegaconf import OmegaConf

from repro.core.errors import ConfigError
from repro.experiments.check import experiments
from repro.experiments.compose import Composer, compose_config, hydra_context, to_dict
from repro.experiments.expspec import ExpSpec, apply_quick
from repro.experiments.grid import expand_points, group_overrides
from repro.experiments.openchoices import parse_open
from repro.experiments.results import CONF_DIR

pytestmark = pytest.mark.usefixtures("no_data")

#: the papers' prefixes; every experiment of these papers declares its open choices
PAPERS = ("laps_", "nightjar_", "goodspeed_", "adaserve_", "turbospec_")
PAPER_EXPS = [e for e in experiments() if e.startswith(PAPERS)]


def _spec(name: str) -> ExpSpec:
    with hydra_context():
        return ExpSpec.parse(apply_quick(to_dict(compose_config([f"+exp={name}"]).exp), False)[0])


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, int | float) and isinstance(b, int | float) and not isinstance(a, bool):
        return math.isclose(float(a), float(b), rel_tol=1e-9)
    return bool(a == b)


@pytest.mark.parametrize("name", PAPER_EXPS)
def test_every_paper_experiment_declares_open_choices_its_points_have(name: str) -> None:
    spec = _spec(name)
    assert spec.open, f"{name}: no exp.open (the values its paper leaves open)"
    groups = group_overrides(CONF_DIR)
    points = expand_points(spec, groups)
    grid = set(spec.grid_columns())
    labels = spec.system_labels()
    composed: dict[str, Any] = {}
    with hydra_context():
        compose = Composer()
        for c in spec.open:
            assert c.key not in grid, f"{name}.{c.name}: {c.key} is swept by the grid (not open)"
            assert c.why.strip(), f"{name}.{c.name}: no why"
            for label in c.systems or labels:
                assert label in labels, f"{name}.{c.name}: system {label!r} is not one of {labels}"
                if label not in composed:
                    point = next(p for p in points if p.system == label)
                    composed[label] = compose([f"+exp={name}", *point.overrides])
                cfg = composed[label]
                node = OmegaConf.select(cfg, c.key, default="<missing>")
                if c.key in groups:  # a config group: its chosen config's name
                    node = OmegaConf.select(cfg, f"{c.key}.name", default="<missing>")
                assert not (isinstance(node, str) and node == "<missing>"), \
                    f"{name}.{c.name}: {c.key} is not a key of {label}'s points"
                assert _same(node, c.value), f"{name}.{c.name}: declared {c.value!r}, {label}'s points run {node!r}"


@pytest.mark.parametrize(("raw", "message"), [
    ({"g": {"key": "system.gamma", "value": 5, "why": "w"}}, "either 'values'"),
    ({"g": {"key": "system.gamma", "value": 5, "values": [3, 4], "why": "w"}}, "not among values"),
    ({"g": {"key": "x", "value": 90, "range": [10, 80], "why": "w"}}, "outside range"),
    ({"g": {"key": "x", "value": 20, "range": [10, 80]}}, "needs 'why'"),
    ({"g": {"key": "x", "value": 20, "range": [10, 80], "why": "w", "scale": "cubic"}}, "scale"),
    ({"g": {"key": "x", "value": 20, "range": [10, 80], "why": "w", "sytems": ["a"]}}, "unknown key"),
])
def test_a_bad_declaration_is_one_error_naming_it(raw: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message) as err:
        parse_open(raw)
    assert "exp.open.g" in str(err.value)
