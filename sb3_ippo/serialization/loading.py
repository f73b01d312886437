"""Loading a model: read the file, set the attributes the model saves, rebuild the policies, load the weights."""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch as th
from gymnasium import spaces

from sb3_ippo.common.checks import check_env_matches
from sb3_ippo.serialization.encoding import _is_class_attribute
from sb3_ippo.serialization.errors import _REBUILD_ERRORS, ModelFileError, _file_errors
from sb3_ippo.serialization.files import PathOrFile, load_safetensors, load_zip_trusted, load_zip_untrusted, safetensors_file
from sb3_ippo.version import __version__

if TYPE_CHECKING:
    from stable_baselines3.common.base_class import BaseAlgorithm

# The attributes that IPPO saves and sets outside ``__init__``: ``_use_env`` (the agents and their spaces) and
# ``_setup_model`` (the learning-rate schedule, the names made from the agent ids). Every other attribute a file holds
# is one that ``__init__`` sets, so the model ``load`` builds with ``_init_setup_model=False`` has it already.
# (tests/test_safe_serialization.py checks, for trained models of several configurations, that nothing else is saved.)
ATTRIBUTES_SET_AFTER_INIT = (
    "n_envs",
    "possible_agents",
    "observation_spaces",
    "action_spaces",
    "observation_space",
    "action_space",
    "lr_schedule",
    "_policy_keys",
    "_log_names",
)
# What a model file must hold to be an IPPO model.
REQUIRED_ATTRIBUTES = ("possible_agents", "policy_class", "policy_kwargs")
REQUIRED_PARAMETERS = ("_policies",)


def saved_attribute_names(model: BaseAlgorithm) -> frozenset[str]:
    """The attributes that ``model.save`` writes, for a ``model`` built with ``_init_setup_model=False``: those it has
    (and :data:`ATTRIBUTES_SET_AFTER_INIT`), but neither those excluded from saving nor the policies and optimizers,
    which are saved as parameters."""
    names = set(vars(model)).union(ATTRIBUTES_SET_AFTER_INIT).difference(model._excluded_save_params())
    return frozenset(name for name in names if not _is_class_attribute(type(model), name))


def restore_attributes(model: BaseAlgorithm, data: Mapping[str, Any], source: Any, safe: bool) -> None:
    """Set on ``model`` (built with ``_init_setup_model=False``) the attributes that a file of ``source`` holds: only
    names that ``model.save`` writes (:func:`saved_attribute_names`), never a name of the class (a method, a property).

    :param safe: For a file that loads without unpickling (safetensors, ``trusted=False``): an unknown name is refused.
        For a trusted zip it is skipped with a warning (see below).
    :raises ModelFileError: naming the attributes that would shadow the class's, or (``safe``) that it does not save.
    """
    cls = type(model)
    shadowing = sorted(name for name in data if _is_class_attribute(cls, name))
    if shadowing:
        raise ModelFileError(
            f"{source} sets {shadowing}, which are methods or properties of {cls.__name__}: a file it saved never holds "
            "them (a crafted or damaged file?)"
        )
    known = saved_attribute_names(model)
    unknown = sorted(set(data).difference(known))
    if unknown and safe:
        raise ModelFileError(
            f"{source} sets {unknown}, which {cls.__name__} does not save: a file that loads without unpickling may set "
            f"only the attributes its model saves (a crafted file, or one of a newer sb3_ippo?)"
        )
    if unknown:
        # SB3 sets every name a zip holds. A zip is a pickle of another version's __dict__ (SB3 and sb3_ippo add and
        # rename attributes): a name this version does not define has no reader, so setting it changes nothing but the
        # model's __dict__, and would keep a stale value that a later version might read. Skip it, and say so: if the
        # loaded model behaves differently, the names are the first clue.
        warnings.warn(
            f"{source} holds attributes that {cls.__name__} (sb3_ippo {_package_version()}) does not have: {unknown}; "
            "they are ignored (the file was saved by another version of sb3_ippo or stable-baselines3?)",
            UserWarning,
            stacklevel=3,
        )
    model.__dict__.update({name: value for name, value in data.items() if name in known})


def _package_version() -> str:
    return __version__


def _check_structure(data: Mapping[str, Any], source: Any) -> None:
    """For a safe file: the attributes the model is rebuilt from are of the types it builds from."""
    agents = data["possible_agents"]
    if not isinstance(agents, list) or not agents or not all(isinstance(agent, str) for agent in agents):
        raise ModelFileError(f"{source}: possible_agents is {agents!r:.80}, not a non-empty list of agent ids")
    for name in ("observation_spaces", "action_spaces"):
        spaces_of = data.get(name)
        if not isinstance(spaces_of, dict) or not all(isinstance(spaces_of.get(agent), spaces.Space) for agent in agents):
            raise ModelFileError(f"{source}: {name} does not map each of possible_agents {agents} to a space")
    if not isinstance(data["policy_kwargs"], dict):
        raise ModelFileError(f"{source}: policy_kwargs is {data['policy_kwargs']!r:.80}, not a dict")


def check_optimizer_states(model: Any, source: Any) -> None:
    """Every optimizer state tensor has the shape of its parameter (``load_state_dict`` does not check; a step would
    fail, or broadcast).

    :raises ModelFileError: naming the optimizer entry, the state and the shape expected.
    """
    for key, policy in model._policies.items():
        optimizer = policy.optimizer
        index = 0
        for group in optimizer.param_groups:
            for parameter in group["params"]:
                for name, value in optimizer.state.get(parameter, {}).items():
                    if isinstance(value, th.Tensor) and value.dim() > 0 and value.shape != parameter.shape:
                        raise ModelFileError(
                            f"{source}: the entry '_policies.{key}.optimizer' state/{index}/{name} has the shape "
                            f"{list(value.shape)}, expected that of its parameter, {list(parameter.shape)}"
                        )
                index += 1


def read_model_file(
    path: PathOrFile,
    device: th.device | str = "auto",
    trusted: bool = True,
    custom_objects: dict[str, Any] | None = None,
    print_system_info: bool = False,
) -> tuple[dict[str, Any], dict[str, Any], bool]:
    """The attributes and parameters of the IPPO model file at ``path``, and whether it was read without unpickling
    (a safetensors file, or a zip with ``trusted=False``).

    :raises ModelFileError: for a file that is damaged, crafted, or not an IPPO model.
    """
    safetensors_path = safetensors_file(path)
    if safetensors_path is not None:
        data, params = load_safetensors(safetensors_path)
    elif not trusted:
        data, params = load_zip_untrusted(path, device=device)
    else:
        data, params = load_zip_trusted(path, device, custom_objects, print_system_info)
    missing = [name for name in REQUIRED_ATTRIBUTES if name not in data]
    missing += [f"parameters {name!r}" for name in REQUIRED_PARAMETERS if name not in params]
    if missing:
        raise ModelFileError(f"{path} is not an IPPO model: it holds no per-agent policies (no {', '.join(missing)})")
    return data, params, safetensors_path is not None or not trusted


def load_model(
    cls: type[Any],
    path: PathOrFile,
    env: Any = None,
    device: th.device | str = "auto",
    trusted: bool = True,
    custom_objects: dict[str, Any] | None = None,
    print_system_info: bool = False,
    kwargs: Mapping[str, Any] | None = None,
) -> Any:
    """``IPPO.load``: read the file, build ``cls`` with ``_init_setup_model=False``, set the attributes the model saves
    (:func:`restore_attributes`), adopt ``env`` (a MultiAgentVecEnv, or None), rebuild the policies, load the weights.

    For a file read without unpickling, whatever fails because its content does not fit together (a missing agent, a
    weight of the wrong shape, hyperparameters out of range) is a ModelFileError naming the file and the entry.
    """
    kwargs = dict(kwargs or {})
    data, params, safe = read_model_file(path, device, trusted, custom_objects, print_system_info)
    if "policy_kwargs" in kwargs and kwargs["policy_kwargs"] != data["policy_kwargs"]:
        raise ValueError(
            f"The specified policy kwargs {kwargs['policy_kwargs']} differ from the stored ones {data['policy_kwargs']}"
        )
    with _file_errors(path, "restoring its attributes", _REBUILD_ERRORS if safe else ()):
        if safe:
            _check_structure(data, path)
        data["policy_kwargs"].pop("device", None)
        model = cls(policy=data["policy_class"], env=None, device=device, _init_setup_model=False)
        restore_attributes(model, data, path, safe)
        model.__dict__.update(kwargs)
        if env is not None:
            check_env_matches(model.possible_agents, model.observation_spaces, model.action_spaces, env)
            model._use_env(env)
    # Past the env check, a ValueError or RuntimeError comes from the file's content: invalid hyperparameters, the
    # groups, a weight of the wrong shape, a missing optimizer (set_parameters).
    with _file_errors(path, "rebuilding the model from it", (*_REBUILD_ERRORS, ValueError, RuntimeError) if safe else ()):
        if safe:
            model._check_hyperparameters()
        model._setup_model()
        model.set_parameters(params, exact_match=True, device=device)
        if safe:
            check_optimizer_states(model, path)
    return model
