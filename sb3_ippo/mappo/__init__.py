"""MAPPO: IPPO with a centralized critic. The names load on first use (PEP 562), so that the model-file code can name
the policy classes (``sb3_ippo.mappo.policies``) without importing the algorithm."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sb3_ippo.mappo.mappo import MAPPO
    from sb3_ippo.mappo.policies import CentralCriticPolicy, MlpPolicy

__all__ = ["MAPPO", "CentralCriticPolicy", "MlpPolicy"]

_MODULES = {
    "MAPPO": "sb3_ippo.mappo.mappo",
    "CentralCriticPolicy": "sb3_ippo.mappo.policies",
    "MlpPolicy": "sb3_ippo.mappo.policies",
}


def __getattr__(name: str) -> Any:
    if name in _MODULES:
        return getattr(importlib.import_module(_MODULES[name]), name)
    raise AttributeError(f"module 'sb3_ippo.mappo' has no attribute {name!r}")
