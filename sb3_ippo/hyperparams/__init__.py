"""Hyperparameters: their checks, and hyperparameters as data: rl-zoo style YAML files, a section per env id.

``ippo.yml`` beside this module holds IPPO's tuned settings for the tasks where they beat its defaults (today the
two-player board games). ``python -m sb3_ippo train`` applies them under a ``--hyperparams`` file and the command
line; Python code gets the same values without copying them::

    from pettingzoo.classic import tictactoe_v3
    from sb3_ippo import IPPO
    from sb3_ippo.hyperparams import tuned_hyperparameters

    env = tictactoe_v3.env()
    model = IPPO("MultiInputPolicy", env, **tuned_hyperparameters(env))

- :mod:`~sb3_ippo.hyperparams.validation`: the checks of every hyperparameter's value, and of their combinations;
- :mod:`~sb3_ippo.hyperparams.text`: hyperparameters read from text (options, files);
- :mod:`~sb3_ippo.hyperparams.files`: the YAML files and :func:`tuned_hyperparameters`.

The names below load on first use (PEP 562): the algorithms import :mod:`~sb3_ippo.hyperparams.validation`, and the
files' code imports the algorithms.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sb3_ippo.hyperparams.files import TUNED_FILE, read_hyperparams_file, tuned_hyperparameters

__all__ = ["TUNED_FILE", "read_hyperparams_file", "tuned_hyperparameters"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        return getattr(importlib.import_module("sb3_ippo.hyperparams.files"), name)
    raise AttributeError(f"module 'sb3_ippo.hyperparams' has no attribute {name!r}")
