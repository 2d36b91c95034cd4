"""Composing configs with Hydra's compose API, with configuration mistakes as one-line errors.

:func:`compose_config` composes conf/config.yaml with a list of overrides inside :func:`hydra_context` (which
restores any enclosing Hydra state, e.g. @hydra.main's) and turns Hydra's and OmegaConf's multi-line errors into a
:class:`~repro.core.errors.ConfigError` on one line (:func:`explain`): a key no config has is named with the nearest
known key, a knob of other systems with the systems that have it, and a config group set like a plain value
(``draft=vicuna-160m``) with the override that selects it (``model@draft=vicuna-160m``). :func:`known_top_keys` and
:func:`check_data_root` are the runner's other checks of a composed config.
"""

from __future__ import annotations

import functools
import hashlib
import os
import pickle
import re
from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from enum import Enum
from pathlib import Path
from typing import Any

from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.errors import HydraException
from hydra.initialize import get_gh_backup, restore_gh_from_backup
from omegaconf import Container, DictConfig, OmegaConf, open_dict
from omegaconf.errors import OmegaConfBaseException

from repro.core.errors import ConfigError
from repro.experiments.grid import group_overrides
from repro.experiments.results import CONF_DIR


def to_dict(node: Any) -> dict[str, Any]:
    """A config node as a plain, resolved dict with string keys: ``OmegaConf.to_container(node, resolve=True)``,
    walked by :func:`_content` (where it cannot, by OmegaConf itself, which then words the error)."""
    if OmegaConf.is_config(node):
        try:
            data = _content(node)
        except Exception:  # (an interpolation that does not resolve, a missing value: OmegaConf's own message)
            data = OmegaConf.to_container(node, resolve=True)
    else:
        data = node
    if not isinstance(data, dict):
        raise ConfigError(f"expected a mapping, got {data!r}")
    return {str(k): v for k, v in data.items()}


def _content(conf: Any) -> Any:
    """``OmegaConf.to_container(conf, resolve=True)`` of a DictConfig or ListConfig (plain dicts, no enums), the
    same values and types, reading each node's value directly and dereferencing only interpolations: OmegaConf's
    own walk looks every child up by key and dereferences every node (about 4× slower; a sweep's every point is
    resolved in the main process). A test holds it to OmegaConf's over every experiment's points."""
    if conf._is_none():
        return None
    if conf._is_missing():
        return "???"
    if conf._is_interpolation():
        conf = conf._dereference_node()
    if isinstance(conf, DictConfig):
        if conf._metadata.object_type not in (dict, None):
            raise TypeError("a structured config")  # (OmegaConf's walk)
        return {key: _value(node) for key, node in conf.__dict__["_content"].items()}
    return [_value(node) for node in conf.__dict__["_content"]]


def _value(node: Any) -> Any:
    """A child node's resolved value (:func:`_content`)."""
    if isinstance(node, Container):
        return _content(node)
    value = node._value()
    if isinstance(value, str) and "${" in value:  # (else never an interpolation)
        node = node._dereference_node()
        if isinstance(node, Container):
            return _content(node)
        value = node._value()
    if isinstance(value, Enum):
        raise TypeError("an enum value")  # (OmegaConf's walk)
    return value


def one_line(exc: BaseException) -> str:
    """An exception's message squeezed onto one line (Hydra's messages span several)."""
    lines = []
    for ln in str(exc).splitlines():
        if ln.strip().startswith(("Config search path", "Set the environment variable HYDRA_FULL_ERROR")):
            break
        if ln.strip():
            lines.append(ln.strip())
    return " ".join(lines) if lines else type(exc).__name__


_NOT_IN_STRUCT = re.compile(r"Could not override '([^']+)'")
_NO_OPTION = re.compile(r"Could not find '([^'/]+)/([^']+)'")
#: what a config group's entries are called in an error
_GROUP_NOUNS = {"exp": "experiment", "system": "system", "model": "model", "hardware": "hardware config",
                "workload": "workload", "engine": "engine profile", "cost": "cost model", "oracle": "oracle",
                "backend": "backend", "launcher": "launcher"}


def no_such_option(group: str, name: str, conf_dir: Path = CONF_DIR) -> str:
    """``exp=smok``: the nearest names of the group (up to three), not the whole list."""
    from repro.core.errors import suggest

    known = sorted(p.stem for p in (conf_dir / group).glob("*.yaml")) if (conf_dir / group).is_dir() else []
    hint = suggest(name, known, n=3, cutoff=0.5, parts=True)
    typed = "+exp" if group == "exp" else group
    return (f"{typed}={name}: no such {_GROUP_NOUNS.get(group, group + ' config')}{hint}; "
            f"python -m repro list names all {len(known)}")


def explain(exc: BaseException, conf_dir: Path = CONF_DIR, overrides: Sequence[str] = ()) -> str:
    """A Hydra composition error on one line.

    For a key no config has, suggest the nearest key (Hydra's own hint, ``+key=value``, would add the typo as a key
    nothing reads). For a grid key the experiment (named in ``overrides``) does not sweep, :func:`unswept_grid_key`.
    """
    missing = _NO_OPTION.search(str(exc))
    if missing:
        return no_such_option(missing.group(1), missing.group(2), conf_dir)
    m = _NOT_IN_STRUCT.search(str(exc))
    if m:
        key = m.group(1)
        if key == "exp":
            value = _override_value(overrides, "exp")
            return (f"exp={value if value is not None else 'NAME'}: an experiment is named with a plus: "
                    f"+exp={value if value is not None else 'NAME'} (python -m repro list names them)")
        if key.startswith("exp.grid.") and key.count(".") == 2:
            return unswept_grid_key(key.removeprefix("exp.grid."), conf_dir, exp_name(overrides),
                                    _override_value(overrides, key))
        owners = _systems_with(key, conf_dir)
        if owners:  # a knob of some systems, not of the one composed (the default, or an experiment's base)
            shown = ", ".join(owners[:6]) + (f" and {len(owners) - 6} more" if len(owners) > 6 else "")
            return (f"{key}: a key of {shown}, not of the system this run composes; name the system too "
                    f"(system={owners[0]} {key}=...)")
        known = _dotted_keys(conf_dir)
        from repro.core.errors import suggest

        return f"{key}: not a config key{suggest(key, known)} (python -m repro list shows the config groups)"
    return one_line(exc)


def _systems_with(key: str, conf_dir: Path) -> list[str]:
    """The system configs (conf/system/*.yaml) that have ``key`` (``system.w_max``), by name."""
    if not key.startswith("system.") or not (conf_dir / "system").is_dir():
        return []
    out = []
    for path in sorted((conf_dir / "system").glob("*.yaml")):
        try:
            node = OmegaConf.load(path)
        except Exception:  # a broken file is reported when it is composed
            continue
        if OmegaConf.select(node, key.removeprefix("system."), default=None) is not None:
            out.append(path.stem)
    return out


@functools.lru_cache(maxsize=4)
def _dotted_keys(conf_dir: Path) -> tuple[str, ...]:
    """Every dotted key of conf/config.yaml plus the config group names."""
    node = OmegaConf.to_container(OmegaConf.load(conf_dir / "config.yaml"))
    out: list[str] = list(group_overrides(conf_dir))

    def walk(prefix: str, d: Any) -> None:
        if isinstance(d, dict):
            for k, v in d.items():
                if k not in ("defaults", "hydra"):
                    out.append(prefix + str(k))
                    walk(prefix + str(k) + ".", v)

    walk("", node)
    for key, name in group_overrides(conf_dir).items():  # each group's own keys, under the key it composes to
        prefix = key.removeprefix("_global_.")
        for path in sorted((conf_dir / name.split("@")[0]).glob("*.yaml")):
            try:
                walk(prefix + ".", OmegaConf.to_container(OmegaConf.load(path)))
            except Exception:  # a broken file is reported when it is composed
                continue
    return tuple(dict.fromkeys(out))


_ACTIVE: list[Path] = []  # the conf dirs of the hydra_context()s entered, innermost last


@contextmanager
def hydra_context(conf_dir: Path = CONF_DIR) -> Iterator[None]:
    """A Hydra compose context on ``conf_dir`` that restores any enclosing Hydra state (e.g.
    @hydra.main's)."""
    backup = get_gh_backup()
    GlobalHydra.instance().clear()
    _ACTIVE.append(conf_dir.resolve())
    try:
        with initialize_config_dir(config_dir=str(conf_dir.resolve()), version_base=None):
            yield
    finally:
        _ACTIVE.pop()
        restore_gh_from_backup(backup)


# ------------------------------------------------------------------------------------- compositions kept on disk
#
# Hydra takes 0.1-0.4 s to compose a config from the YAML files; the same files and overrides always compose to the
# same config. So a composition is kept on disk (pickled, as Composer keeps its own in memory), keyed by the
# overrides, the conf folder's path and the contents of every file in it, and the versions of Hydra, OmegaConf and
# this module: an edited config file, another release or another folder is another key. Only successful
# compositions are kept (an error is Hydra's every time). The folder is $REPRO_COMPOSE_CACHE, else
# $XDG_CACHE_HOME/specrepro/compose (~/.cache/...); REPRO_COMPOSE_CACHE=0 turns it off.

_DIGESTS: dict[tuple[Path, tuple[tuple[str, int, int], ...]], str] = {}


def _cache_dir() -> Path | None:
    env = os.environ.get("REPRO_COMPOSE_CACHE")
    if env is not None and env.strip().lower() in ("0", "off", "false", "no", ""):
        return None
    if env:
        return Path(env)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "specrepro" / "compose"


def _conf_digest(conf_dir: Path) -> str:
    """A digest of every file under ``conf_dir`` (paths and contents), recomputed only when a file's size or
    modification time changes."""
    files = sorted(p for p in conf_dir.rglob("*") if p.is_file())
    stat = tuple((str(p.relative_to(conf_dir)), (st := p.stat()).st_mtime_ns, st.st_size) for p in files)
    key = (conf_dir, stat)
    if key not in _DIGESTS:
        h = hashlib.sha256()
        for p in files:
            h.update(str(p.relative_to(conf_dir)).encode() + b"\0" + p.read_bytes() + b"\0")
        _DIGESTS[key] = h.hexdigest()
    return _DIGESTS[key]


@functools.cache
def _module_digest() -> str:
    """This module's own source, part of every key (read once per process)."""
    return hashlib.sha256(Path(__file__).read_bytes()).hexdigest()


def _disk_key(overrides: Sequence[str]) -> Path | None:
    folder = _cache_dir()
    if folder is None or not _ACTIVE:
        return None
    import hydra
    import omegaconf

    conf_dir = _ACTIVE[-1]
    parts = [str(conf_dir), _conf_digest(conf_dir), hydra.__version__, omegaconf.__version__, _module_digest(),
             *overrides]
    return folder / (hashlib.sha256("\0".join(parts).encode()).hexdigest() + ".pkl")


def _disk_get(path: Path | None) -> tuple[DictConfig, dict[str, str]] | None:
    if path is None or not path.is_file():
        return None
    try:
        cfg, choices = pickle.loads(path.read_bytes())
    except Exception:  # a torn or foreign file: compose again (and overwrite it)
        return None
    return (cfg, choices) if isinstance(cfg, DictConfig) and isinstance(choices, dict) else None


def _disk_put(path: Path | None, cfg: DictConfig, choices: dict[str, str]) -> None:
    if path is None:
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_bytes(pickle.dumps((cfg, choices)))
        os.replace(tmp, path)  # atomic: a concurrent reader sees the old file or the new one
    except OSError:  # a read-only or full disk: the cache is only a cache
        pass


def compose_config(overrides: Sequence[str], where: str = "") -> DictConfig:
    """Compose conf/config.yaml with ``overrides`` inside :func:`hydra_context`.

    Config mistakes → ConfigError.
    """
    return _compose_with_choices(overrides, where)[0]


def _compose_with_choices(overrides: Sequence[str], where: str = "") -> tuple[DictConfig, dict[str, str]]:
    """:func:`compose_config`, and the option each config group got (Hydra's ``runtime.choices``): what
    ``compose`` returns, its ``hydra`` node read and then dropped as ``compose`` drops it."""
    key = _disk_key(overrides)
    kept = _disk_get(key)
    if kept is not None:
        cfg, choices = kept
    else:
        try:
            cfg = compose(config_name="config", overrides=list(overrides), return_hydra_config=True)
            choices = {str(k): str(v) for k, v in cfg.hydra.runtime.choices.items() if v is not None}
            with open_dict(cfg):
                del cfg["hydra"]
        except (HydraException, OmegaConfBaseException) as exc:
            raise ConfigError(f"{where}{explain(exc, overrides=overrides)}") from None
    _check_groups(cfg, where)
    if kept is None:
        _disk_put(key, cfg, choices)
    return cfg, choices


class Composer:
    """Compose many points' configs fast; each equals :func:`compose_config` of its overrides, less the ``exp`` block.

    - Use inside :func:`hydra_context`.
    - Hydra composes each distinct combination of group choices (``system=...``, ``model@draft=...``, ``+exp=...``)
      once; a point's other overrides are applied to a copy as Hydra applies them (after composition, in struct
      mode: ``ConfigLoaderImpl._apply_overrides_to_config``).
    - ``exp`` is dropped: a point never reads it and no config interpolates it.
    - An override Hydra treats specially (``hydra.*``, a sweep, one on ``exp``) falls back to a full composition.
    """

    def __init__(self, conf_dir: Path = CONF_DIR) -> None:
        self._conf_dir = conf_dir
        self._groups: dict[str, bool] = {}
        # per tuple of group overrides: the composition pickled with and without its exp block (unpickling copies 4x
        # faster than deepcopy; points never read the block), and each group's option in it
        self._cache: dict[tuple[str, ...], tuple[bytes, bytes, dict[str, str]]] = {}
        self._live: dict[bytes, DictConfig] = {}  # per composition (pickled, without exp): the copy planned() resolves

    def _is_group(self, key: str) -> bool:
        if key not in self._groups:
            self._groups[key] = (self._conf_dir / key).is_dir()
        return self._groups[key]

    def __call__(self, overrides: Sequence[str], where: str = "", *, keep_exp: bool = False) -> DictConfig:
        """The config ``overrides`` compose to, without its ``exp`` block unless ``keep_exp`` (the command line's
        own config, which the runner reads the experiment from: :func:`repro.__main__.validate`)."""
        split = self._split(overrides, where, keep_exp)
        if isinstance(split, DictConfig):
            return split
        entry, values = split
        cfg = pickle.loads(entry[0] if keep_exp else entry[1])  # a fresh copy: its own nodes, parents and flags
        _apply(values, cfg, where)
        return cfg

    def planned(self, overrides: Sequence[str], where: str = "") -> tuple[DictConfig | Recipe, dict[str, Any]]:
        """A point's config (without ``exp``) and its :func:`to_dict`, where it can be as a :class:`Recipe`.

        A point whose own overrides each change one existing value (``rps=4``, ``system.k=3``: a sweep's grid
        values) is resolved on one live copy of its composition, its values restored after, and given as the
        recipe a worker builds it from; any other comes as the config itself. Unpickling a composition took
        5-12 ms a point: resolving many points' configs in one process (``repro check``) no longer copies one each.
        """
        split = self._split(overrides, where)
        if isinstance(split, DictConfig):
            return split, to_dict(split)
        entry, values = split
        live = self._live.get(entry[1])
        if live is None:
            live = self._live[entry[1]] = pickle.loads(entry[1])
        with _on_live(live, values, where) as cfg:
            if cfg is not None:
                return Recipe(entry[1], tuple(str(o.input_line) for o in values), where), to_dict(cfg)
        cfg = pickle.loads(entry[1])
        _apply(values, cfg, where)
        return cfg, to_dict(cfg)

    def _split(self, overrides: Sequence[str], where: str = "", keep_exp: bool = False
               ) -> DictConfig | tuple[tuple[bytes, bytes, dict[str, str]], list[Any]]:
        """The cached composition of ``overrides``' group choices and its other (parsed) overrides; or the config
        itself, fully composed, for an override Hydra treats specially."""
        try:
            parsed = _parse_lines(overrides)
        except HydraException:
            return compose_config(overrides, where)  # Hydra's own error, worded as usual
        if any(o.is_hydra_override() or o.is_sweep_override() or o.key_or_group.startswith("exp.")
               for o in parsed):
            full = compose_config(overrides, where)
            return full if keep_exp else _without_exp(full)
        is_group = [not isinstance(o.value(), dict) and self._is_group(o.key_or_group) for o in parsed]
        groups = [o for o, g in zip(parsed, is_group, strict=True) if g]
        group = tuple(str(o.input_line) for o in groups)
        values = [o for o, g in zip(parsed, is_group, strict=True) if not g]
        entry = self._cache.get(group) or self._same_as_cached(groups)
        if entry is None:
            cfg0, choices = _compose_with_choices(list(group), where)
            with_exp = pickle.dumps(cfg0)
            entry = (with_exp, pickle.dumps(_without_exp(cfg0)), choices)
        self._cache[group] = entry
        return entry, values

    def _same_as_cached(self, groups: Sequence[Any]) -> tuple[bytes, bytes, dict[str, str]] | None:
        """A cached composition that ``groups`` (parsed group overrides) also compose to, or None.

        That of a subsequence of ``groups`` whose every missing override picks the option the composition already
        chose for its group (``system=vllm`` where vLLM is the default): same defaults tree, same config.
        """
        from hydra.core.override_parser.types import OverrideType

        lines = [str(o.input_line) for o in groups]
        keys = [o.key_or_group + (f"@{o.package}" if o.package else "") for o in groups]
        if len(set(keys)) < len(keys):
            return None  # a group set twice: only Hydra knows which wins
        for cached, entry in self._cache.items():
            at = 0
            ok = True
            for line, key, o in zip(lines, keys, groups, strict=True):
                if at < len(cached) and cached[at] == line:
                    at += 1
                elif not (o.type == OverrideType.CHANGE and isinstance(o.value(), str)
                          and entry[2].get(key) == o.value()):
                    ok = False
                    break
            if ok and at == len(cached):
                return entry
        return None


class Recipe:
    """A point's config as a worker builds it: its composition (pickled, without ``exp``) and the point's own
    overrides, applied as :class:`Composer` applies them (:meth:`config`). What :meth:`Composer.planned` gives for
    a sweep's points, and :func:`repro.experiments.launch.run_one` accepts in place of the config."""

    __slots__ = ("base", "overrides", "where")

    def __init__(self, base: bytes, overrides: tuple[str, ...], where: str = "") -> None:
        self.base, self.overrides, self.where = base, overrides, where

    def config(self) -> DictConfig:
        cfg = pickle.loads(self.base)
        _apply(_parse_lines(self.overrides), cfg, self.where)
        return cfg

    @contextmanager
    def applied(self) -> Iterator[DictConfig]:
        """The config :meth:`config` builds, lent on this process's live copy of the composition: the point's
        overrides applied, the copy read-only while lent, its values restored after (a sweep's worker runs many
        points of one composition; unpickling it took 5-10 ms a point). Overrides that are not changes of existing
        values get :meth:`config`'s own copy."""
        live = _LIVE.get(self.base)
        if live is None:
            if len(_LIVE) >= _LIVE_MAX:
                _LIVE.pop(next(iter(_LIVE)))
            live = _LIVE[self.base] = pickle.loads(self.base)
        with _on_live(live, _parse_lines(self.overrides), self.where) as cfg:
            yield self.config() if cfg is None else cfg

    def __reduce__(self) -> tuple[Any, ...]:
        return Recipe, (self.base, self.overrides, self.where)


_LIVE: dict[bytes, DictConfig] = {}  # per composition a Recipe names: this process's live copy (Recipe.applied)
_LIVE_MAX = 32


@contextmanager
def _on_live(live: DictConfig, values: Sequence[Any], where: str) -> Iterator[DictConfig | None]:
    """``live`` (a live copy of a composition) with parsed overrides ``values`` applied, read-only, and set back as
    composed afterwards, also when what ran on it failed (its pickle is then byte-identical); ``None`` where an
    override is not a change of one existing value (an addition, a node, a list: the caller composes a copy)."""
    saved = [_leaf_value(live, o) for o in values]
    if any(v is _NOT_SIMPLE for v in saved):
        yield None
        return
    flag = live._get_node_flag("readonly")
    try:
        _apply(values, live, where)
        OmegaConf.set_readonly(live, True)
        yield live
    finally:
        OmegaConf.set_readonly(live, flag)
        for o, value in zip(reversed(values), reversed(saved), strict=True):
            OmegaConf.update(live, o.key_or_group, value, merge=True)


def as_config(cfg: DictConfig | Recipe) -> DictConfig:
    """The config itself (a :class:`Recipe` built)."""
    return cfg.config() if isinstance(cfg, Recipe) else cfg


def lent(cfg: DictConfig | Recipe) -> AbstractContextManager[DictConfig]:
    """The config, lent for reading: a :class:`Recipe`'s on the live copy (:meth:`Recipe.applied`)."""
    return cfg.applied() if isinstance(cfg, Recipe) else nullcontext(cfg)


_PARSES: dict[str, Any] = {}  # each override line's parse (Hydra's grammar is slow; points repeat lines)


def _parse_lines(lines: Sequence[str]) -> list[Any]:
    """Hydra's parse of each override line, once per process (a line that does not parse raises HydraException)."""
    new = [line for line in dict.fromkeys(lines) if line not in _PARSES]
    if new:
        from hydra.core.override_parser.overrides_parser import OverridesParser

        _PARSES.update(zip(new, OverridesParser.create().parse_overrides(new), strict=True))
    return [_PARSES[line] for line in lines]


def _apply(values: Sequence[Any], cfg: DictConfig, where: str) -> None:
    """Apply parsed value overrides as Hydra does after composing (struct mode), then the group check."""
    from hydra._internal.config_loader_impl import ConfigLoaderImpl

    try:
        ConfigLoaderImpl._apply_overrides_to_config(list(values), cfg)
    except (HydraException, OmegaConfBaseException) as exc:
        raise ConfigError(f"{where}{explain(exc)}") from None
    _check_groups(cfg, where)


_NOT_SIMPLE = object()


def _leaf_value(cfg: DictConfig, override: Any) -> Any:
    """The value (as written: an interpolation stays its text) an override that changes one existing value of
    ``cfg`` replaces, or :data:`_NOT_SIMPLE` for any other override (an addition, a deletion, a node, a list)."""
    from hydra.core.override_parser.types import OverrideType
    from omegaconf import ValueNode

    if override.type != OverrideType.CHANGE or override.package is not None \
            or isinstance(override.value(), (dict, list)):
        return _NOT_SIMPLE
    node: Any = cfg
    for part in str(override.key_or_group).split("."):
        node = node._get_node(part, validate_access=False, throw_on_missing_key=False) \
            if isinstance(node, DictConfig) else None
        if node is None:
            return _NOT_SIMPLE
    return node._value() if isinstance(node, ValueNode) else _NOT_SIMPLE


def _without_exp(cfg: DictConfig) -> DictConfig:
    with open_dict(cfg):
        cfg.pop("exp", None)
    return cfg


def _check_groups(cfg: DictConfig, where: str) -> None:
    for key, name in group_overrides(CONF_DIR).items():
        node = cfg.get(key) if key in cfg else None
        if isinstance(node, str):  # e.g. draft=vicuna-160m replaced the group's config by a string
            raise ConfigError(f"{where}{key}={node}: '{key}' is a config group; select it with {name}={node}")


def known_top_keys(conf_dir: Path, exp_name: str | None) -> set[str]:
    """Top-level keys some config defines: conf/config.yaml's, the config groups, and the experiment file's."""
    known = set(group_overrides(conf_dir)) | {"exp", "hydra"}
    for path in [conf_dir / "config.yaml", *([conf_dir / "exp" / f"{exp_name}.yaml"] if exp_name else [])]:
        if path.is_file():
            node = OmegaConf.load(path)
            if isinstance(node, DictConfig):
                known |= {str(k) for k in node if k != "defaults"}
    return known


def exp_name(overrides: Sequence[str]) -> str | None:
    """The experiment ``+exp=NAME`` (or ``exp=NAME``) in ``overrides`` selects (None: the default one)."""
    return next((o.split("=", 1)[1] for o in overrides if o.lstrip("+").startswith("exp=")), None)


def own_grid_keys(conf_dir: Path, name: str | None) -> list[str]:
    """The keys experiment ``name``'s file sweeps (in ``exp.grid``, its cases' grids and its quick block's).

    Empty for the default experiment.
    """
    path = conf_dir / "exp" / f"{name}.yaml"
    node = OmegaConf.load(path) if name and path.is_file() else None
    exp = node.get("exp") if isinstance(node, DictConfig) else None
    if not isinstance(exp, DictConfig):
        return []
    holders = [exp, exp.get("quick") or {}]
    holders += [c for h in list(holders) for c in (h.get("cases") or []) if isinstance(c, DictConfig)]
    keys: dict[str, None] = {}
    for h in holders:
        grid = h.get("grid")
        if isinstance(grid, DictConfig):
            keys.update(dict.fromkeys(str(k) for k in grid))
    return list(keys)


def unswept_grid_key(key: str, conf_dir: Path, name: str | None, values: Any = None) -> str:
    """Why ``exp.grid.KEY`` is refused when the experiment does not sweep KEY: what it sweeps, and the override
    that sets one value for every point."""
    from repro.experiments.grid import format_value

    swept = own_grid_keys(conf_dir, name)
    first = values[0] if isinstance(values, list | tuple) and values else values
    example = "VALUE" if first is None or isinstance(first, list | tuple | dict) else format_value(first)
    return (f"exp.grid.{key}: {f'experiment {name}' if name else 'the default experiment'} does not sweep {key} "
            f"({'it sweeps ' + ', '.join(swept) if swept else 'it sweeps nothing'}; the command line may change a "
            f"swept key's values, not add a key): {key}={example} sets one value for every point")


def check_grid_keys(exp: Mapping[str, Any], conf_dir: Path, name: str | None) -> None:
    """Every grid key of the composed ``exp`` block (its grid and its cases') is one experiment ``name``'s file
    sweeps: a key added on the command line is refused (:func:`unswept_grid_key`)."""
    own = set(own_grid_keys(conf_dir, name))
    grids = [exp.get("grid") or {}, *((c.get("grid") or {}) for c in exp.get("cases") or [] if isinstance(c, Mapping))]
    for grid in grids:
        for key, values in grid.items():
            if str(key) not in own:
                raise ConfigError(unswept_grid_key(str(key), conf_dir, name, values))


def _override_value(overrides: Sequence[str], key: str) -> Any:
    """The value ``overrides`` give ``key`` (parsed as Hydra parses it; None when none does)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    for text in reversed(list(overrides)):
        if text.lstrip("+").split("=", 1)[0] == key:
            try:
                return OverridesParser.create().parse_overrides([text])[0].value()
            except HydraException:
                return None
    return None


def check_data_root(cfg: DictConfig) -> None:
    """``$REPRO_DATA`` (or ``workload.data_dir``) must name an existing folder when set (a typo is an error, not a
    silent switch to the embedded statistics)."""
    from workloads import check_data_root as check

    check(OmegaConf.select(cfg, "workload.data_dir", default=None))
