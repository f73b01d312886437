"""PettingZoo envs named by module (``"mpe2.simple_spread_v3"``), with a chain of SuperSuit wrappers.

What the command line trains on: :class:`EnvFactory` is a picklable env function for ``make_vec_env`` (worker
processes rebuild the env from the module name and the wrappers' names and arguments).
"""

from __future__ import annotations

import importlib
import inspect
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

# SuperSuit functions that make vectorized envs rather than wrap one env: they have no place in a chain.
_VECTORIZERS = {
    "concat_vec_envs",
    "gym_vec_env",
    "pettingzoo_env_to_vec_env",
    "stable_baselines3_vec_env",
    "stable_baselines_vec_env",
    "vectorize_aec_env",
}

# Arguments for the wrappers that require some, chosen for the usual Atari-like image pipeline.
WRAPPER_DEFAULTS: dict[str, dict[str, Any]] = {
    "resize": {"x_size": 84, "y_size": 84},
    "dtype": {"dtype": "float32"},
    "frame_skip": {"num_frames": 4},
    "delay_observations": {"delay": 1},
    "max_observation": {"memory": 2},
    "sticky_actions": {"repeat_action_probability": 0.25},
}

# The package to install when an env module's import fails on a missing one.
_INSTALL_HINTS = {
    "mpe2": "pip install mpe2",
    "pymunk": "pip install 'pettingzoo[butterfly]'",
    "pygame": "pip install pygame",
    "supersuit": "pip install supersuit",
    "multi_agent_ale_py": "pip install 'pettingzoo[atari]'",
    "chess": "pip install 'pettingzoo[classic]'",
    "rlcard": "pip install 'pettingzoo[classic]'",
    "Box2D": "pip install 'pettingzoo[sisl]'",
}


def install_hint(error: ImportError) -> str:
    """``pip install ...`` for the module whose import failed."""
    missing = (error.name or "").split(".")[0]
    return _INSTALL_HINTS.get(missing, f"pip install {missing}" if missing else "check the module name")


def _pettingzoo_word(env_id: str) -> str | None:
    """What PettingZoo says of an env module that does not exist, where it knows it: an older version
    (``pettingzoo.sisl.pursuit_v4``: "pursuit_v4 is now deprecated, use pursuit_v5 instead", with the module to give)
    or a removed env. Its env packages answer such names with a ``DeprecatedModule`` whose functions raise that
    message, or a ``RemovedEnv`` error; for any other name, None."""
    package_name, _, name = env_id.rpartition(".")
    if not package_name:
        return None
    try:
        found = getattr(importlib.import_module(package_name), name)
    except ImportError:
        return None
    except AttributeError as error:  # RemovedEnv: the env is gone from PettingZoo, and the message says why
        return str(error) if type(error).__name__ == "RemovedEnv" else None
    if type(found).__name__ != "DeprecatedModule":
        return None
    try:
        found.env()
    except ImportError as error:  # DeprecatedEnv
        newer = re.search(r"use (\w+) instead", str(error))
        return f"{error} (--env {package_name}.{newer.group(1)})" if newer else str(error)
    return None


def load_env_fn(env_id: str) -> Callable[..., Any]:
    """``"mpe2.simple_spread_v3"`` -> ``simple_spread_v3.parallel_env`` (or ``.env`` if it has no parallel_env).

    :raises ValueError: when the module cannot be imported (saying what to install) or is not a PettingZoo env module.
    """
    try:
        module = importlib.import_module(env_id)
    except ImportError as error:
        missing = error.name or ""
        # The env module itself (or a package on its path inside an installed one) does not exist: a wrong name.
        if env_id == missing or (env_id.startswith(missing + ".") and missing != env_id.split(".")[0]):
            pettingzoo_word = _pettingzoo_word(env_id) if env_id == missing else None
            if pettingzoo_word is not None:
                raise ValueError(f"Cannot import the env module {env_id!r}: {pettingzoo_word}") from error
            raise ValueError(
                f"Cannot import the env module {env_id!r} ({error}): give a PettingZoo env module, e.g. "
                "mpe2.simple_spread_v3 or pettingzoo.butterfly.pistonball_v6"
            ) from error
        raise ValueError(
            f"Cannot import the env module {env_id!r} ({error}): {install_hint(error)}, or give another PettingZoo "
            "env module, e.g. mpe2.simple_spread_v3 or pettingzoo.butterfly.pistonball_v6"
        ) from error
    env_fn = next((getattr(module, name) for name in ("parallel_env", "env") if callable(getattr(module, name, None))), None)
    if env_fn is None:
        raise ValueError(f"The module {env_id!r} has neither parallel_env() nor env(): it is not a PettingZoo env module")
    return env_fn


def _supersuit() -> Any:
    try:
        import supersuit
    except ImportError as error:
        raise ValueError(f"Wrappers come from SuperSuit, which is not installed: {install_hint(error)}") from error
    return supersuit


def _wrapper_parameters(function: Any) -> list[inspect.Parameter] | None:
    """The parameters after ``env`` of a SuperSuit wrapper for parallel envs; None if it cannot wrap one."""
    if hasattr(function, "parallel_wrapper"):  # A WrapperChooser: one class per kind of env.
        if function.parallel_wrapper is None:
            return None
        parameters = list(inspect.signature(function.parallel_wrapper.__init__).parameters.values())[1:]
    else:
        parameters = list(inspect.signature(function).parameters.values())
    if not parameters or parameters[0].name != "env":
        return None
    return [p for p in parameters[1:] if p.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)]


def available_wrappers() -> dict[str, str]:
    """SuperSuit's wrappers that wrap one parallel env: short name (``"resize"``) -> newest function (``"resize_v1"``)."""
    supersuit = _supersuit()
    newest: dict[str, tuple[int, str]] = {}
    for attribute in dir(supersuit):
        match = re.fullmatch(r"(\w+)_v(\d+)", attribute)
        if match is None or match.group(1) in _VECTORIZERS:
            continue
        if _wrapper_parameters(getattr(supersuit, attribute)) is None:
            continue
        version = int(match.group(2))
        if match.group(1) not in newest or version > newest[match.group(1)][0]:
            newest[match.group(1)] = (version, attribute)
    return {name: attribute for name, (_, attribute) in sorted(newest.items())}


@dataclass(frozen=True)
class WrapperSpec:
    """A SuperSuit wrapper by name (``"resize"`` or ``"resize_v1"``) with its keyword arguments."""

    name: str
    kwargs: Mapping[str, Any] = field(default_factory=dict)

    def function_name(self) -> str:
        """The SuperSuit function: the newest version for a name without one (``"resize"`` -> ``"resize_v1"``).

        :raises ValueError: for an unknown wrapper, listing the known ones.
        """
        wrappers = available_wrappers()
        function_name = wrappers.get(self.name)
        versioned = re.fullmatch(r"(\w+)_v\d+", self.name)
        if versioned and versioned.group(1) in wrappers and self.name in dir(_supersuit()):
            function_name = self.name  # an older version, named explicitly
        if function_name is None:
            raise ValueError(f"Unknown SuperSuit wrapper {self.name!r}: choose from {', '.join(wrappers)}")
        return function_name

    def resolve(self) -> tuple[Callable[..., Any], dict[str, Any]]:
        """The SuperSuit function and its full keyword arguments (defaults of :data:`WRAPPER_DEFAULTS` filled in).

        :raises ValueError: for an unknown wrapper, an unknown argument or a missing one, with what is expected.
        """
        short = re.sub(r"_v\d+$", "", self.name)
        function = getattr(_supersuit(), self.function_name())
        parameters = {p.name: p for p in _wrapper_parameters(function) or []}
        kwargs = {**WRAPPER_DEFAULTS.get(short, {}), **self.kwargs}
        unknown = [name for name in kwargs if name not in parameters]
        if unknown:
            known = ", ".join(parameters) or "none"
            raise ValueError(f"The wrapper {short} has no argument {', '.join(unknown)}: its arguments are {known}")
        missing = [name for name, p in parameters.items() if p.default is inspect.Parameter.empty and name not in kwargs]
        if missing:
            example = ",".join(f"{name}=VALUE" for name in missing)
            raise ValueError(f"The wrapper {short} needs {', '.join(missing)}: e.g. {short}:{example}")
        return function, kwargs

    def resolved(self) -> WrapperSpec:
        """This wrapper with its versioned name and every argument explicit, as a run records it: a later default
        (of SuperSuit's or of :data:`WRAPPER_DEFAULTS`) does not change what it means."""
        _, kwargs = self.resolve()
        return WrapperSpec(self.function_name(), kwargs)

    def __str__(self) -> str:
        if not self.kwargs:
            return self.name
        return self.name + ":" + ",".join(f"{key}={value!r}" for key, value in self.kwargs.items())


@dataclass(frozen=True)
class EnvFactory:
    """Makes the env of module ``env_id`` (its ``parallel_env``, else ``env``) and wraps it with ``wrappers`` in order.

    Picklable, so ``make_vec_env(EnvFactory(...), vec_env_cls="subproc")`` works: workers rebuild it by name.
    """

    env_id: str
    wrappers: Sequence[WrapperSpec] = ()

    def __call__(self, **env_kwargs: Any) -> Any:
        env = load_env_fn(self.env_id)(**env_kwargs)
        for spec in self.wrappers:
            function, kwargs = spec.resolve()
            env = function(env, **kwargs)
        return env

    def check(self) -> None:
        """Import the env module and resolve every wrapper now, so that a mistake fails before anything is built.

        :raises ValueError: naming the env module or the wrapper at fault.
        """
        load_env_fn(self.env_id)
        for spec in self.wrappers:
            spec.resolve()
