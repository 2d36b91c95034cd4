"""A system's policy from its ``system`` config node (:func:`instantiate_system`)."""

from __future__ import annotations

from typing import Any

from omegaconf import OmegaConf

from repro.core.errors import ConfigError
from repro.experiments.results import DISPLAY_KEYS
from repro.sim.policy import Policy

__all__ = ["instantiate_system"]

_SCALARS = (str, int, float, bool, type(None))


def _own_policy(node: Any) -> Policy | None:
    """One of this suite's policies (``_target_`` in ``systems.``) built from scalar keyword arguments, as Hydra's
    ``instantiate`` builds it, without its per-call set-up (a config copy, its flags, the target policy's checks:
    1 ms of each point); ``None`` for anything else, which Hydra instantiates."""
    target = node.get("_target_")
    if not isinstance(target, str) or not target.startswith("systems."):
        return None
    kwargs = {str(k): v for k, v in node.items() if k != "_target_"}
    if any(k.startswith("_") or not isinstance(v, _SCALARS) for k, v in kwargs.items()):
        return None  # (_partial_, _args_, a nested node: Hydra's semantics)
    from hydra.utils import get_class

    try:
        cls = get_class(target)
    except Exception:  # Hydra words the error
        return None
    return cls(**kwargs)


def instantiate_system(node: Any, where: str = "") -> Policy:
    """The policy a ``system`` config node describes (a constructor's complaint becomes a one-line ConfigError);
    :data:`DISPLAY_KEYS` are not passed to it."""
    from hydra.utils import instantiate

    if any(k in node for k in DISPLAY_KEYS):
        plain = OmegaConf.to_container(node, resolve=True) if OmegaConf.is_config(node) else dict(node)
        assert isinstance(plain, dict)
        node = {str(k): v for k, v in plain.items() if k not in DISPLAY_KEYS}
    try:
        policy = _own_policy(node)
    except Exception as exc:  # the constructor's TypeError names the key that is wrong
        raise ConfigError(f"{where}system config ({node.get('_target_', '?')}): {exc}") from None
    try:
        policy = instantiate(node) if policy is None else policy
    except Exception as exc:  # Hydra wraps the constructor's TypeError; surface the key that is wrong
        cause = exc.__cause__ or exc
        raise ConfigError(f"{where}system config ({node.get('_target_', '?')}): {cause}") from None
    if not isinstance(policy, Policy):
        raise ConfigError(f"{where}system config: {node.get('_target_')} is not a repro.sim.policy.Policy")
    return policy
