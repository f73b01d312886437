"""The settings of a training run: command line > hyperparameter file (rl-zoo's YAML format) > defaults.
``TrainSettings`` is what run.json holds, and its ``argv`` re-runs the training."""

from __future__ import annotations

import argparse
import inspect
import pathlib
import shlex
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torch import nn

import sb3_ippo
from sb3_ippo.cli.values import jsonable, to_text
from sb3_ippo.hyperparams.text import hyperparameter_type, parse_wrapper, schedule
from sb3_ippo.env_factory import WrapperSpec
from sb3_ippo.hyperparameters import check_hyperparameter
from sb3_ippo.ippo import IPPO

DEFAULT_ENV = "mpe2.simple_spread_v3"
DEFAULT_ENV_KWARGS: dict[str, Any] = {"N": 3, "max_cycles": 25}
RUN_FILE = "run.json"
MODEL_FILE = "model.zip"
CHECKPOINT_FOLDER = "checkpoints"  # where train --checkpoint-freq writes, inside --out
# Defaults of the train options that a hyperparameter file may also set (the command line wins over the file).
TRAIN_DEFAULTS: dict[str, Any] = {"timesteps": 200_000, "n_envs": 8, "vec_env": "dummy", "policy": "MlpPolicy"}
PRINT_EVERY = 5_000
# Hyperparameters for envs where IPPO's defaults do not fit, under the hyperparameter file and the command line.
# Two-player board games: self-play, one shared network for both seats, and the settings benchmarks/games.py measured
# (docs/games.md).
GAME_DEFAULTS: dict[str, Any] = {
    "share_parameters": True,
    "self_play_pool": {"snapshot_every": 10, "size": 20},
    "n_steps": 512,
    "n_episodes": None,
    "batch_size": 128,
    "n_epochs": 10,
    "learning_rate": "lin_1e-3",
    "ent_coef": 0.01,
    "policy_kwargs": {"net_arch": [256, 256], "activation_fn": nn.ReLU},
}
ENV_DEFAULTS: dict[str, dict[str, Any]] = {
    "pettingzoo.classic.tictactoe_v3": {**GAME_DEFAULTS, "n_steps": 1024, "batch_size": 256},
    "pettingzoo.classic.connect_four_v3": GAME_DEFAULTS,
}
# IPPO arguments that are not hyperparameters, or that have an option of their own.
NOT_HYPERPARAMETERS = {"policy", "env", "seed", "verbose", "device", "tensorboard_log", "_init_setup_model"}


def hyperparameter_defaults() -> dict[str, Any]:
    """IPPO's hyperparameters (the options of ``train``) and their defaults, in signature order."""
    return {
        name: parameter.default
        for name, parameter in inspect.signature(IPPO.__init__).parameters.items()
        if name not in NOT_HYPERPARAMETERS and name != "self"
    }


# Keys of a hyperparameter file section besides the hyperparameters, with their option names.
_FILE_KEYS = {
    "n_timesteps": "timesteps",
    "timesteps": "timesteps",
    "n_envs": "n_envs",
    "vec_env": "vec_env",
    "policy": "policy",
    "env_kwargs": "env_kwargs",
    "wrappers": "wrappers",
}


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


def _file_value(key: str, value: Any, types: dict[str, Callable[[str], Any]]) -> tuple[str, Any]:
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


def read_hyperparams_file(path: pathlib.Path, env_id: str, types: dict[str, Callable[[str], Any]]) -> dict[str, Any]:
    """The section of ``env_id`` (its full module name, else its last part) of an rl-zoo style YAML file, as option
    names -> validated values.

    :raises ValueError: naming the file, the section and the key at fault.
    """
    import yaml

    try:
        content = yaml.safe_load(path.read_text())
    except OSError as error:
        raise ValueError(f"cannot read {path}: {error.strerror}") from None
    except yaml.YAMLError as error:
        raise ValueError(f"{path} is not valid YAML: {error}") from None
    if not isinstance(content, dict):
        raise ValueError(f"{path} must map env ids to sections of hyperparameters, e.g. '{env_id}:' then indented keys")
    section_name = next((name for name in (env_id, env_id.split(".")[-1]) if name in content), None)
    if section_name is None:
        raise ValueError(f"{path} has no section for {env_id}: its sections are {', '.join(map(str, content)) or 'none'}")
    section = content[section_name] or {}
    if not isinstance(section, dict):
        raise ValueError(f"{path}: the section {section_name} must map hyperparameters to values, got {section!r}")
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


@dataclass
class TrainSettings:
    """Everything a training run depends on; run.json holds it, and :meth:`argv` re-runs it."""

    env: str
    env_kwargs: dict[str, Any]
    wrappers: list[WrapperSpec]
    timesteps: int
    n_envs: int
    vec_env: str
    policy: str
    seed: int
    device: str
    threads: int
    hyperparameters: dict[str, Any]  # every IPPO hyperparameter, defaults included
    verbose: int
    log_interval: int
    print_every: int
    tensorboard_log: str | None
    checkpoint_freq: int
    eval_freq: int
    n_eval_episodes: int
    eval_episodes: int
    out: str

    def argv(self) -> list[str]:
        """The ``train`` arguments that reproduce this run: every setting explicit (no hyperparameter file, every
        hyperparameter even at its default, in case a default changes), except ``--out``."""
        env_kwargs = [f"{key}={to_text(value)}" for key, value in self.env_kwargs.items()]
        argv = ["train", "--env", self.env, "--env-kwargs", *env_kwargs]
        if self.wrappers:
            argv += ["--wrappers", *(str(spec.resolved()) for spec in self.wrappers)]
        options = {
            "timesteps": self.timesteps,
            "n_envs": self.n_envs,
            "vec_env": self.vec_env,
            "policy": self.policy,
            "seed": self.seed,
            "device": self.device,
            "threads": self.threads,
            "verbose": self.verbose,
            "log_interval": self.log_interval,
            "print_every": self.print_every,
            "tensorboard_log": self.tensorboard_log,
            "checkpoint_freq": self.checkpoint_freq,
            "eval_freq": self.eval_freq,
            "n_eval_episodes": self.n_eval_episodes,
            "eval_episodes": self.eval_episodes,
            **self.hyperparameters,
        }
        for name, value in options.items():
            if value is not None or name in self.hyperparameters:
                argv += ["--" + name.replace("_", "-"), to_text(value)]
        return argv

    def to_json(self) -> dict[str, Any]:
        argv = self.argv()
        return {
            "sb3_ippo_version": sb3_ippo.__version__,
            "out": self.out,
            "command": shlex.join(["python", "-m", "sb3_ippo", *argv]),
            "argv": argv,
            "env": self.env,
            "env_kwargs": jsonable(self.env_kwargs),
            "wrappers": [str(spec.resolved()) for spec in self.wrappers],
            "timesteps": self.timesteps,
            "n_envs": self.n_envs,
            "vec_env": self.vec_env,
            "policy": self.policy,
            "seed": self.seed,
            "device": self.device,
            "threads": self.threads,
            "hyperparameters": jsonable(self.hyperparameters),
            "logging": {
                "verbose": self.verbose,
                "log_interval": self.log_interval,
                "print_every": self.print_every,
                "tensorboard_log": self.tensorboard_log,
                "checkpoint_freq": self.checkpoint_freq,
                "eval_freq": self.eval_freq,
                "n_eval_episodes": self.n_eval_episodes,
                "eval_episodes": self.eval_episodes,
            },
        }


def resolve_train_settings(args: argparse.Namespace, parser: argparse.ArgumentParser) -> TrainSettings:
    """Merge the command line, the hyperparameter file and the defaults; any mistake is a usage error."""
    env_id = args.env or DEFAULT_ENV
    defaults = hyperparameter_defaults()
    types = {
        name: hyperparameter_type(name, str(parameter.annotation))
        for name, parameter in inspect.signature(IPPO.__init__).parameters.items()
        if name in defaults
    }
    from_file: dict[str, Any] = {}
    if args.hyperparams is not None:
        try:
            from_file = read_hyperparams_file(args.hyperparams, env_id, types)
        except ValueError as error:
            parser.error(f"argument --hyperparams: {error}")

    def setting(name: str, default: Any) -> Any:
        given = getattr(args, name, None)  # hyperparameters: absent unless given; other options: None
        if given is not None or (name in defaults and hasattr(args, name)):
            return given
        return from_file.get(name, default)

    if args.env_kwargs is not None:
        env_kwargs = dict(args.env_kwargs)
    else:
        env_kwargs = from_file.get("env_kwargs", dict(DEFAULT_ENV_KWARGS) if env_id == DEFAULT_ENV else {})
    env_defaults = ENV_DEFAULTS.get(env_id, {})
    hyperparameters = {name: setting(name, env_defaults.get(name, default)) for name, default in defaults.items()}
    return TrainSettings(
        env=env_id,
        env_kwargs=env_kwargs,
        wrappers=list(setting("wrappers", [])),
        timesteps=setting("timesteps", TRAIN_DEFAULTS["timesteps"]),
        n_envs=setting("n_envs", TRAIN_DEFAULTS["n_envs"]),
        vec_env=setting("vec_env", TRAIN_DEFAULTS["vec_env"]),
        policy=setting("policy", TRAIN_DEFAULTS["policy"]),
        seed=args.seed,
        device=args.device,
        threads=args.threads,
        hyperparameters=hyperparameters,
        verbose=args.verbose,
        log_interval=args.log_interval,
        print_every=args.print_every,
        tensorboard_log=None if args.tensorboard_log is None else str(args.tensorboard_log),
        checkpoint_freq=args.checkpoint_freq,
        eval_freq=args.eval_freq,
        n_eval_episodes=args.n_eval_episodes,
        eval_episodes=args.eval_episodes,
        out=str(args.out or pathlib.Path("runs") / f"ippo_{env_id.split('.')[-1]}"),
    )
