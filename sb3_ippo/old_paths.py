"""Where code and model files of earlier versions find the modules that moved (issue 33's layout), and the one place of
such re-exports.

A zip saved by ``model.save`` names the class path of each object it pickled (``sb3_ippo.normalization``'s
``ObservationNormalizer``, ``sb3_ippo.ppo_update``'s ``UpdateStats``), and user code may import a module by its old
name (``from sb3_ippo.self_play import ModelOpponent``). Each old name below is served by a small module that hands
out the new module's names (PEP 562), loaded only when asked for: ``import sb3_ippo`` installs the finder and imports
nothing else. New code imports the new paths.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import types
from typing import Any

# Old module path -> the module that holds its contents now.
MOVED_MODULES = {
    "sb3_ippo.acting": "sb3_ippo.common.acting",
    "sb3_ippo.buffer": "sb3_ippo.common.buffer",
    "sb3_ippo.checks": "sb3_ippo.common.checks",
    "sb3_ippo.critic_input": "sb3_ippo.common.critic_input",
    "sb3_ippo.env_factory": "sb3_ippo.common.env_factory",
    "sb3_ippo.evaluation": "sb3_ippo.common.evaluation",
    "sb3_ippo.export": "sb3_ippo.common.export",
    "sb3_ippo.groups": "sb3_ippo.common.groups",
    "sb3_ippo.hyperparameters": "sb3_ippo.hyperparams.validation",
    "sb3_ippo.logs": "sb3_ippo.common.logs",
    "sb3_ippo.masking": "sb3_ippo.games.masking",
    "sb3_ippo.normalization": "sb3_ippo.common.normalization",
    "sb3_ippo.on_policy_algorithm": "sb3_ippo.common.on_policy_algorithm",
    "sb3_ippo.plotting": "sb3_ippo.common.plotting",
    "sb3_ippo.ppo_update": "sb3_ippo.update.ppo",
    "sb3_ippo.preprocessing": "sb3_ippo.common.preprocessing",
    "sb3_ippo.recurrent": "sb3_ippo.update.recurrent",
    "sb3_ippo.self_play": "sb3_ippo.games.self_play",
    "sb3_ippo.threads": "sb3_ippo.common.threads",
    "sb3_ippo.types": "sb3_ippo.common.type_aliases",
    "sb3_ippo.vec_env.turn_based": "sb3_ippo.games.turn_based",
}


class _MovedModuleFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds the old module paths of :data:`MOVED_MODULES`, each as a module whose names are the new module's."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname not in MOVED_MODULES:
            return None
        return importlib.machinery.ModuleSpec(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> None:
        return None  # the default module object

    def exec_module(self, module: types.ModuleType) -> None:
        new_name = MOVED_MODULES[module.__name__]
        target = importlib.import_module(new_name)
        module.__doc__ = f"Moved to :mod:`{new_name}`: this name stays for code and model files of earlier versions."
        public = getattr(target, "__all__", [name for name in vars(target) if not name.startswith("_")])
        setattr(module, "__all__", list(public))  # noqa: B010 (ModuleType declares no __all__)
        module.__getattr__ = lambda name: getattr(target, name)  # type: ignore[method-assign]
        module.__dir__ = lambda: dir(target)  # type: ignore[method-assign]


def install() -> None:
    """Let the old module paths be imported (once per process; ``import sb3_ippo`` calls it). The finder goes first,
    so that no file left at an old path (an editable install of an earlier checkout, say) is imported instead."""
    if not any(isinstance(finder, _MovedModuleFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _MovedModuleFinder())
