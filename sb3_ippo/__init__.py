"""Independent PPO (IPPO) for PettingZoo multi-agent environments, as a Stable-Baselines3 algorithm.

The names below load on first use (PEP 562), so that a process that imports one part of the package (the learner
process of ``async_training`` imports ``sb3_ippo.update``) does not load the others (the env layer, evaluation).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from sb3_ippo import old_paths
from sb3_ippo.version import __version__ as __version__

if TYPE_CHECKING:
    from sb3_ippo.common.evaluation import MultiAgentEvalCallback, evaluate_policy
    from sb3_ippo.hyperparams import tuned_hyperparameters
    from sb3_ippo.ippo import IPPO
    from sb3_ippo.mappo import MAPPO
    from sb3_ippo.vec_env import MultiAgentVecEnv, make_vec_env

__all__ = [
    "IPPO",
    "MAPPO",
    "MultiAgentEvalCallback",
    "MultiAgentVecEnv",
    "evaluate_policy",
    "make_vec_env",
    "tuned_hyperparameters",
]

# The modules that moved stay importable by their old names (model files of earlier versions name them).
old_paths.install()

_MODULES = {
    "IPPO": "sb3_ippo.ippo",
    "MAPPO": "sb3_ippo.mappo",
    "MultiAgentEvalCallback": "sb3_ippo.common.evaluation",
    "evaluate_policy": "sb3_ippo.common.evaluation",
    "MultiAgentVecEnv": "sb3_ippo.vec_env",
    "make_vec_env": "sb3_ippo.vec_env",
    "tuned_hyperparameters": "sb3_ippo.hyperparams",
}


def __getattr__(name: str) -> Any:
    if name in _MODULES:
        return getattr(importlib.import_module(_MODULES[name]), name)
    raise AttributeError(f"module 'sb3_ippo' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
