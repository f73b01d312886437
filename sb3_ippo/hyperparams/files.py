"""Hyperparameter files in rl-zoo's format (a section per env id) and the tuned settings that ship in the package.

The command line's ``--hyperparams FILE.yml`` and the packaged tuned settings are read by the same
:func:`read_hyperparams_file`, and Python code gets the same values through :func:`tuned_hyperparameters`.
"""

from __future__ import annotations

import argparse
import inspect
import os
import pathlib
import types
from collections.abc import Callable, Mapping
from typing import Any

from sb3_ippo.common.env_factory import WrapperSpec
from sb3_ippo.hyperparams.validation import check_hyperparameter
from sb3_ippo.hyperparams.text import hyperparameter_type, parse_wrapper, schedule
from sb3_ippo.ippo import IPPO

# IPPO's settings for the tasks where tuned values beat its defaults: under the user's hyperparameter file and the
# command line in ``python -m sb3_ippo train``, and what tuned_hyperparameters returns.
TUNED_FILE = pathlib.Path(__file__).with_name("ippo.yml")
# IPPO arguments that are not hyperparameters, or that have an option of their own.
NOT_HYPERPARAMETERS = {"policy", "env", "seed", "verbose", "device", "tensorboard_log", "_init_setup_model"}
# Keys of a section besides the hyperparameters: how the command line builds the run, with their option names.
_FILE_KEYS = {
    "n_timesteps": "timesteps",
    "timesteps": "timesteps",
    "n_envs": "n_envs",
    "vec_env": "vec_env",
    "policy": "policy",
    "env_kwargs": "env_kwargs",
    "wrappers": "wrappers",
}


def hyperparameter_defaults() -> dict[str, Any]:
    """IPPO's hyperparameters (the options of ``train``) and their defaults, in signature order."""
    return {
        name: parameter.default
        for name, parameter in inspect.signature(IPPO.__init__).parameters.items()
        if name not in NOT_HYPERPARAMETERS and name != "self"
    }


def hyperparameter_types() -> dict[str, Callable[[str], Any]]:
    """How each IPPO hyperparameter is read from text (an option, a file's text value), from its annotation."""
    parameters = inspect.signature(IPPO.__init__).parameters
    return {name: hyperparameter_type(name, str(parameters[name].annotation)) for name in hyperparameter_defaults()}


def _file_wrappers(value: Any) -> list[WrapperSpec]:
    """``[name, "name:key=value", {name: {key: value}}, ...]`` -> specs."""
    specs = []
    for item in value if isinstance(value, list) else [value]:
        if isinstance(item, str):
            specs.append(parse_wrapper(item))
        elif isinstance(item, dict) and len(item) == 1:
            (name, kwargs), *_ = item.items()
            spec = WrapperSpec(str(name), dict(kwargs or {}))
            spec.resolve()
            specs.append(spec)
        else:
            raise ValueError(f"a wrapper is NAME, 'NAME:KEY=VALUE,...' or {{NAME: {{KEY: VALUE}}}}, got {item!r}")
    return specs


def _file_value(key: str, value: Any, types: Mapping[str, Callable[[str], Any]]) -> tuple[str, Any]:
    """One entry of a hyperparameter file section, validated as the command line validates it."""
    if key in types:  # a hyperparameter
        if isinstance(value, str):  # YAML reads 3e-4 (no dot) as text, and policy_kwargs is text in rl-zoo files
            return key, types[key](value)
        check_hyperparameter(key, schedule(value))
        return key, value
    option = _FILE_KEYS[key]
    if option in ("timesteps", "n_envs"):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not float(value).is_integer() or value < 1:
            raise ValueError(f"must be a positive integer, got {value!r}")
        return option, int(value)
    if option == "vec_env" and value not in ("dummy", "subproc"):
        raise ValueError(f"must be 'dummy' or 'subproc', got {value!r}")
    if option == "policy" and value not in IPPO.policy_aliases:
        raise ValueError(f"must be one of {list(IPPO.policy_aliases)}, got {value!r}")
    if option == "env_kwargs" and not isinstance(value, dict):
        raise ValueError(f"must be a mapping KEY: VALUE, got {value!r}")
    if option == "wrappers":
        return option, _file_wrappers(value)
    return option, value


def _section_name(content: Mapping[Any, Any], env_id: str) -> Any | None:
    """The section of ``env_id``: its full module name, else its last part, else a section whose last part is the
    env's (a file written with full module names serves an env known by ``metadata["name"]``)."""
    short_name = env_id.split(".")[-1]
    for name in (env_id, short_name):
        if name in content:
            return name
    return next((name for name in content if str(name).split(".")[-1] == short_name), None)


def read_hyperparams_file(
    path: str | os.PathLike[str],
    env_id: str,
    types: Mapping[str, Callable[[str], Any]] | None = None,
    *,
    required: bool = True,
) -> dict[str, Any]:
    """The section of ``env_id`` of an rl-zoo style YAML file, as option names -> validated values (schedules stay
    text, ``lin_1e-3``, as the command line records them; :func:`~sb3_ippo.hyperparams.text.schedule` converts them).

    :param types: how hyperparameters written as text are read (default: :func:`hyperparameter_types`).
    :param required: whether a file without a section for ``env_id`` is an error; if not, the result is ``{}``.
    :raises ValueError: naming the file, the section and the key at fault.
    """
    import yaml

    path = pathlib.Path(path)
    try:
        content = yaml.safe_load(path.read_text())
    except OSError as error:
        raise ValueError(f"cannot read {path}: {error.strerror}") from None
    except yaml.YAMLError as error:
        raise ValueError(f"{path} is not valid YAML: {error}") from None
    if not isinstance(content, dict):
        raise ValueError(f"{path} must map env ids to sections of hyperparameters, e.g. '{env_id}:' then indented keys")
    section_name = _section_name(content, env_id)
    if section_name is None:
        if not required:
            return {}
        raise ValueError(f"{path} has no section for {env_id}: its sections are {', '.join(map(str, content)) or 'none'}")
    section = content[section_name] or {}
    if not isinstance(section, dict):
        raise ValueError(f"{path}: the section {section_name} must map hyperparameters to values, got {section!r}")
    types = hyperparameter_types() if types is None else types
    values = {}
    for key, value in section.items():
        if key not in types and key not in _FILE_KEYS:
            valid = ", ".join([*_FILE_KEYS, *types])
            raise ValueError(f"{path}: section {section_name}: unknown key {key!r}; valid keys: {valid}")
        try:
            option, parsed = _file_value(key, value, types)
        except (ValueError, argparse.ArgumentTypeError) as error:
            raise ValueError(f"{path}: section {section_name}: {key}: {error}") from None
        values[option] = parsed
    return values


def env_id_of(env: Any) -> str:
    """The id that names ``env``'s section: an env id as given, a module's name, else the env's ``metadata["name"]``
    (a PettingZoo env, wrapped or not; for a vectorized env, its first copy's).

    :raises TypeError: if ``env`` has no name to go by.
    """
    if isinstance(env, str):
        return env
    if isinstance(env, types.ModuleType):
        return env.__name__
    metadata = getattr(env, "metadata", None) or {}
    if "name" not in metadata and callable(getattr(env, "get_attr", None)):
        metadata = env.get_attr("metadata", [0])[0] or {}
    name = metadata.get("name")
    if not isinstance(name, str):
        raise TypeError(
            f"cannot tell which env {type(env).__name__} is: its metadata has no 'name'. Pass the env id instead, "
            "e.g. 'pettingzoo.classic.tictactoe_v3'"
        )
    return name


def tuned_hyperparameters(env: Any, file: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    """IPPO's keyword arguments tuned for ``env``: ``IPPO("MultiInputPolicy", env, **tuned_hyperparameters(env))``.

    :param env: an env id (``"pettingzoo.classic.tictactoe_v3"``, or its last part ``"tictactoe_v3"``), the env's
        module (``tictactoe_v3``), or the env itself (a PettingZoo env, wrapped or not, or ``make_vec_env``'s
        result), known by its ``metadata["name"]``.
    :param file: a hyperparameter file of your own, in the format ``python -m sb3_ippo train --hyperparams`` reads;
        None reads the tuned settings that ship with the package (:data:`TUNED_FILE`).
    :return: the section's hyperparameters, converted as the command line converts them (``lin_1e-3`` -> SB3's
        ``LinearSchedule`` from 1e-3 to 0, ``activation_fn=nn.ReLU`` -> ``torch.nn.ReLU``); a new dict on each call.
        The keys that say how the command line builds the run (``n_timesteps``, ``n_envs``, ``vec_env``, ``policy``,
        ``env_kwargs``, ``wrappers``) are not IPPO arguments and are left out. ``{}`` for an env the packaged file
        has no section for: IPPO's defaults are the settings known for it, so any env can be written this way.
    :raises ValueError: if ``file`` has no section for the env, or a value is invalid (naming the file, the section
        and the key).
    """
    env_id = env_id_of(env)
    types = hyperparameter_types()
    if file is None:
        values = read_hyperparams_file(TUNED_FILE, env_id, types, required=False)
    else:
        values = read_hyperparams_file(file, env_id, types)
    return {name: schedule(value) for name, value in values.items() if name in types}
