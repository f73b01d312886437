"""Command line: ``python -m sb3_ippo train`` and ``python -m sb3_ippo evaluate MODEL.zip|RUN_FOLDER``.

Every bad value is an argparse usage error (exit status 2, the usage line and what was expected), never a
traceback. ``train`` writes into ``--out``: ``model.zip``, ``progress.csv`` (SB3's CSV log, one row per update),
``learning_curve.png`` (with matplotlib) and ``run.json``, which holds every setting (the hyperparameters with their
defaults) and the exact command that re-runs the same training.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import importlib.util
import inspect
import io
import json
import os
import pathlib
import re
import shlex
import sys
import tempfile
import zipfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from stable_baselines3.common.logger import CSVOutputFormat, HumanOutputFormat, KVWriter, Logger, TensorBoardOutputFormat

import sb3_ippo
from sb3_ippo.env_factory import EnvFactory, WrapperSpec
from sb3_ippo.evaluation import AgentEvaluation, evaluate_agents
from sb3_ippo.hyperparameters import check_hyperparameter
from sb3_ippo.ippo import IPPO
from sb3_ippo.vec_env import make_vec_env

DEFAULT_ENV = "mpe2.simple_spread_v3"
DEFAULT_ENV_KWARGS: dict[str, Any] = {"N": 3, "max_cycles": 25}
RUN_FILE = "run.json"
MODEL_FILE = "model.zip"
# Defaults of the train options that a hyperparameter file may also set (the command line wins over the file).
TRAIN_DEFAULTS: dict[str, Any] = {"timesteps": 200_000, "n_envs": 8, "vec_env": "dummy", "policy": "MlpPolicy"}
PRINT_EVERY = 5_000
# IPPO arguments that are not hyperparameters, or that have an option of their own.
_NOT_HYPERPARAMETERS = {"policy", "env", "seed", "verbose", "device", "tensorboard_log", "_init_setup_model"}
_SCHEDULE = re.compile(r"lin_(.+)")
_TORCH_NN = re.compile(r"(?:(?:th|torch)\.)?nn\.(\w+)")


# --------------------------------------------------------------------------------------------------------------
# Values: text -> Python, and back (run.json's command re-parses what it writes)
# --------------------------------------------------------------------------------------------------------------


def _node_value(node: ast.AST) -> Any:
    """A literal, ``dict(key=value, ...)`` or a torch activation such as ``nn.ReLU`` (for ``activation_fn``)."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "dict" and not node.args:
        return {keyword.arg: _node_value(keyword.value) for keyword in node.keywords}
    if isinstance(node, ast.Dict):
        return {_node_value(key): _node_value(value) for key, value in zip(node.keys, node.values, strict=True)}  # type: ignore[arg-type]
    if isinstance(node, (ast.List, ast.Tuple)):
        values = [_node_value(element) for element in node.elts]
        return values if isinstance(node, ast.List) else tuple(values)
    match = _TORCH_NN.fullmatch(ast.unparse(node)) if isinstance(node, ast.Attribute) else None
    if match is not None:
        from torch import nn

        module = getattr(nn, match.group(1), None)
        if isinstance(module, type) and issubclass(module, nn.Module):
            return module
        raise ValueError(f"torch.nn has no module {match.group(1)!r}")
    try:
        return ast.literal_eval(node)
    except ValueError:
        raise ValueError(f"{ast.unparse(node)} is not a Python literal") from None


def literal(text: str) -> Any:
    """A Python literal (number, bool, None, list, dict, ``dict(key=literal, ...)``), or the text itself."""
    try:
        return _node_value(ast.parse(text, mode="eval").body)
    except (ValueError, SyntaxError, TypeError):
        return text


def to_text(value: Any) -> str:
    """The option text that :func:`literal` (or the option's type) parses back into ``value``."""
    if isinstance(value, dict) and all(isinstance(key, str) and key.isidentifier() for key in value):
        return "dict(" + ", ".join(f"{key}={to_text(item)}" for key, item in value.items()) + ")"
    if isinstance(value, (list, tuple)):
        items = ", ".join(to_text(item) for item in value)
        return f"[{items}]" if isinstance(value, list) else f"({items}{',' if len(value) == 1 else ''})"
    if isinstance(value, type):
        return f"nn.{value.__name__}"
    if isinstance(value, str):
        return value
    return repr(value)


def jsonable(value: Any) -> Any:
    """``value`` for run.json: torch module classes (``activation_fn``) as their option text, tuples as lists."""
    if isinstance(value, dict):
        return {key: jsonable(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(item) for item in value]
    if isinstance(value, type):
        return to_text(value)
    return value


def _integer(text: str) -> int:
    """An integer, also written as ``2e5`` or ``200_000``."""
    try:
        return int(text)
    except ValueError:
        number = float(text)
        if not number.is_integer():
            raise ValueError(f"{text} is not a whole number") from None
        return int(number)


def _typed(function: Callable[[str], Any], expected: str) -> Callable[[str], Any]:
    """An argparse ``type`` that turns any failure into a usage error saying what was ``expected``."""

    def parse(text: str) -> Any:
        try:
            return function(text)
        except (ValueError, TypeError, SyntaxError, OverflowError) as error:
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r} ({error})") from None

    parse.__name__ = expected  # What argparse names in "invalid <type> value".
    return parse


def _at_least(minimum: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        value = _integer(text)
        if value < minimum:
            raise ValueError(f"{value} < {minimum}")
        return value

    return parse


positive_int = _typed(_at_least(1), "a positive integer")
non_negative_int = _typed(_at_least(0), "an integer >= 0")


def _env_kwarg(text: str) -> tuple[str, Any]:
    key, sep, value = text.partition("=")
    if not sep or not key.isidentifier():
        raise ValueError("not KEY=VALUE")
    return key, literal(value)


env_kwarg = _typed(_env_kwarg, "KEY=VALUE (e.g. N=3 or continuous_actions=True)")


def _keyword_value(node: ast.AST) -> Any:
    try:
        return _node_value(node)
    except ValueError:
        return ast.unparse(node)  # a bare word: dtype=float32


def _wrapper(text: str) -> WrapperSpec:
    name, _, arguments = text.partition(":")
    kwargs = {}
    if arguments:
        # Parsed as a Python call's keyword arguments, so that values may hold commas: reshape:shape=(84,84,1)
        call = ast.parse(f"_({arguments})", mode="eval").body
        if not isinstance(call, ast.Call) or call.args or any(keyword.arg is None for keyword in call.keywords):
            raise ValueError("its arguments are KEY=VALUE,...")
        kwargs = {str(keyword.arg): _keyword_value(keyword.value) for keyword in call.keywords}
    spec = WrapperSpec(name, kwargs)
    spec.resolve()  # Unknown wrapper, unknown or missing argument: a usage error now, not a failure in a worker.
    return spec


wrapper_spec = _typed(_wrapper, "a SuperSuit wrapper NAME or NAME:KEY=VALUE,... (e.g. resize:x_size=64,y_size=64)")


def _device(text: str) -> str:
    if text != "auto":
        import torch as th

        th.device(text)  # RuntimeError for an unknown device
    return text


def device(text: str) -> str:
    try:
        return _device(text)
    except RuntimeError as error:
        raise argparse.ArgumentTypeError(f"expected auto, cpu, cuda, cuda:N or mps, got {text!r} ({error})") from None


def _boolean(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("true", "1", "yes", "on"):
        return True
    if lowered in ("false", "0", "no", "off"):
        return False
    raise ValueError("not a boolean")


def _number(text: str) -> float:
    return float(text)


def _number_or_schedule(text: str) -> float | str:
    match = _SCHEDULE.fullmatch(text.strip())
    if match:
        float(match.group(1))  # lin_<initial value>: linear decay to 0, as in rl-zoo
        return text.strip()
    return float(text)


def _dict(text: str) -> dict[str, Any]:
    value = _node_value(ast.parse(text, mode="eval").body)
    if not isinstance(value, dict):
        raise ValueError("not a dict")
    return value


def schedule(value: Any) -> Any:
    """``"lin_3e-4"`` -> SB3's ``LinearSchedule`` from 3e-4 down to 0 over the run (rl-zoo's notation); else ``value``."""
    match = _SCHEDULE.fullmatch(value) if isinstance(value, str) else None
    if match is None:
        return value
    from stable_baselines3.common.utils import LinearSchedule

    return LinearSchedule(start=float(match.group(1)), end=0.0, end_fraction=1.0)


def hyperparameter_type(name: str, annotation: str) -> Callable[[str], Any]:
    """The argparse ``type`` of an IPPO hyperparameter, from its annotation; the value is validated as IPPO does."""
    base: Callable[[str], Any]
    if "Schedule" in annotation:
        base, expected = _number_or_schedule, "a number or lin_<number> (a linear schedule)"
    elif annotation.startswith("bool"):
        base, expected = _boolean, "True or False"
    elif annotation.startswith("int"):
        base, expected = _integer, "an integer"
    elif annotation.startswith("float"):
        base, expected = _number, "a number"
    elif annotation.startswith("dict"):
        base, expected = _dict, 'a dict, e.g. "dict(net_arch=[64, 64])"'
    else:
        base, expected = literal, "a value"
    optional = "None" in annotation

    def parse(text: str) -> Any:
        if optional and text.strip().lower() in ("none", "null"):
            value = None
        else:
            try:
                value = base(text)
            except (ValueError, TypeError, SyntaxError, OverflowError) as error:
                none = " or None" if optional else ""
                raise argparse.ArgumentTypeError(f"expected {expected}{none}, got {text!r} ({error})") from None
        try:
            check_hyperparameter(name, schedule(value))
        except ValueError as error:
            raise argparse.ArgumentTypeError(str(error)) from None
        return value

    parse.__name__ = name
    return parse


# --------------------------------------------------------------------------------------------------------------
# The parser
# --------------------------------------------------------------------------------------------------------------


def _hyperparameter_help() -> dict[str, str]:
    """Each ``:param name:`` of IPPO's docstring, whole, for --help."""
    doc = inspect.getdoc(IPPO) or ""
    helps = {}
    for match in re.finditer(r":param (\w+): (.*?)(?=\n\s*:param|\Z)", doc, flags=re.S):
        helps[match.group(1)] = " ".join(match.group(2).split()).replace("%", "%%")
    return helps


def hyperparameter_defaults() -> dict[str, Any]:
    """IPPO's hyperparameters (the options of ``train``) and their defaults, in signature order."""
    return {
        name: parameter.default
        for name, parameter in inspect.signature(IPPO.__init__).parameters.items()
        if name not in _NOT_HYPERPARAMETERS and name != "self"
    }


def _add_hyperparameters(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        "IPPO hyperparameters",
        "Every IPPO argument; the command line wins over --hyperparams, which wins over IPPO's default. "
        "None is written None; schedules as lin_<start> (linear decay to 0).",
    )
    helps = _hyperparameter_help()
    for name, parameter in inspect.signature(IPPO.__init__).parameters.items():
        if name in _NOT_HYPERPARAMETERS or name == "self":
            continue
        group.add_argument(
            "--" + name.replace("_", "-"),
            dest=name,
            type=hyperparameter_type(name, str(parameter.annotation)),
            default=argparse.SUPPRESS,  # absent unless given: None is a value some of them take
            metavar="VALUE",
            help=f"{helps.get(name, '')} (default: {parameter.default!r})",
        )


TRAIN_EPILOG = f"""\
examples:
  python -m sb3_ippo train                                   # {DEFAULT_ENV}, N=3, max_cycles=25, 200k env steps
  python -m sb3_ippo train --env mpe2.simple_adversary_v3 --timesteps 100000 --out runs/adv
  python -m sb3_ippo train --env-kwargs N=3 continuous_actions=True --n-episodes 16 --learning-rate lin_1e-3
  python -m sb3_ippo train --env pettingzoo.butterfly.pistonball_v6 --env-kwargs n_pistons=4 continuous=False \\
      --wrappers color_reduction resize frame_stack --policy CnnPolicy
  python -m sb3_ippo train --hyperparams ippo.yml            # a section per env id, as in rl-zoo

hyperparameter file (YAML), one section per env id (the full module name or its last part):
  mpe2.simple_spread_v3:
    n_timesteps: 500000        # or timesteps
    n_envs: 8
    policy: MlpPolicy
    env_kwargs: {{N: 3, max_cycles: 25}}
    wrappers: [color_reduction, "resize:x_size=64,y_size=64"]
    learning_rate: lin_1e-3
    policy_kwargs: "dict(net_arch=[64, 64])"

logging: every update writes a row to progress.csv (and TensorBoard with --tensorboard-log); the table on stdout
is printed at most every --print-every env steps, without per-agent keys unless --verbose 2.
"""


@dataclass
class Parsers:
    main: argparse.ArgumentParser
    train: argparse.ArgumentParser
    evaluate: argparse.ArgumentParser


def _add_env_options(parser: argparse.ArgumentParser, default_text: str) -> None:
    parser.add_argument("--env", default=None, metavar="MODULE", help=f"PettingZoo env module (default: {default_text})")
    parser.add_argument(
        "--env-kwargs",
        nargs="*",
        type=env_kwarg,
        default=None,
        metavar="KEY=VALUE",
        help=f"arguments of the env function, as Python literals (default: {DEFAULT_ENV_KWARGS} for {DEFAULT_ENV}, "
        "else none; an empty --env-kwargs gives none)",
    )
    parser.add_argument(
        "--wrappers",
        nargs="*",
        type=wrapper_spec,
        default=None,
        metavar="WRAPPER",
        help="SuperSuit wrappers applied in order, each NAME or NAME:KEY=VALUE,... with the NAME of a SuperSuit "
        "function without its version (color_reduction, resize, frame_stack, dtype, normalize_obs, flatten, ...). "
        "resize defaults to x_size=84,y_size=84 (default: none)",
    )


def build_parser() -> Parsers:
    main = argparse.ArgumentParser(
        prog="python -m sb3_ippo",
        description="Independent PPO (IPPO) for PettingZoo multi-agent envs, as a Stable-Baselines3 algorithm.",
    )
    commands = main.add_subparsers(dest="command", required=True, metavar="{train,evaluate}")

    train = commands.add_parser(
        "train",
        help="train IPPO; save the model, a CSV log, a learning curve and run.json",
        description="Train IPPO and write model.zip, progress.csv, learning_curve.png and run.json into --out, "
        "then evaluate the model.",
        epilog=TRAIN_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_env_options(train, DEFAULT_ENV)
    train.add_argument("--hyperparams", type=pathlib.Path, metavar="FILE.yml", help="YAML file, a section per env id")
    train.add_argument(
        "--timesteps", type=positive_int, help=f"env steps to train for (default: {TRAIN_DEFAULTS['timesteps']})"
    )
    train.add_argument(
        "--n-envs", type=positive_int, help=f"env copies stepped together (default: {TRAIN_DEFAULTS['n_envs']})"
    )
    train.add_argument(
        "--vec-env",
        choices=["dummy", "subproc"],
        help="run the copies in this process or in worker processes (default: dummy)",
    )
    train.add_argument(
        "--policy", choices=list(IPPO.policy_aliases), help=f"every agent's policy (default: {TRAIN_DEFAULTS['policy']})"
    )
    train.add_argument("--seed", type=non_negative_int, default=0, help="seed of everything (default: 0)")
    train.add_argument("--device", type=device, default="auto", help="torch device: auto, cpu, cuda, ... (default: auto)")
    train.add_argument(
        "--verbose",
        type=int,
        choices=[0, 1, 2],
        default=1,
        help="0: no table on stdout; 1: the table; 2: the table with per-agent keys (default: 1)",
    )
    train.add_argument("--out", type=pathlib.Path, default=None, help="output folder (default: runs/ippo_<env name>)")
    train.add_argument(
        "--log-interval",
        type=positive_int,
        default=1,
        help="write the log (CSV, TensorBoard, stdout) every N updates; refused if the run would make fewer than N "
        "updates (default: 1)",
    )
    train.add_argument(
        "--print-every",
        type=non_negative_int,
        default=PRINT_EVERY,
        metavar="ENV_STEPS",
        help=f"print the table on stdout at most every this many env steps; 0: at every log (default: {PRINT_EVERY})",
    )
    train.add_argument(
        "--tensorboard-log", type=pathlib.Path, default=None, metavar="DIR", help="also log to TensorBoard in DIR/IPPO_<n>"
    )
    train.add_argument(
        "--checkpoint-freq",
        type=non_negative_int,
        default=0,
        metavar="ENV_STEPS",
        help="save the model into OUT/checkpoints every this many env steps; 0: never (default: 0)",
    )
    train.add_argument(
        "--eval-freq",
        type=non_negative_int,
        default=0,
        metavar="ENV_STEPS",
        help="evaluate on a separate env every this many env steps, log eval/mean_reward and keep "
        "OUT/best_model.zip; 0: never (default: 0)",
    )
    train.add_argument(
        "--n-eval-episodes", type=positive_int, default=5, help="episodes of each --eval-freq evaluation (default: 5)"
    )
    train.add_argument(
        "--eval-episodes", type=non_negative_int, default=50, help="episodes of the final evaluation; 0: none (default: 50)"
    )
    train.add_argument("--no-progress-bar", action="store_true", help="do not show a progress bar")
    train.add_argument(
        "--threads",
        type=positive_int,
        default=1,
        help="torch threads (default: 1, several times faster than more for small networks on a few cores)",
    )
    _add_hyperparameters(train)

    evaluate = commands.add_parser(
        "evaluate",
        help="print a saved model's team and per-agent returns",
        description="Evaluate a saved model: team return and each agent's return, mean and std over --episodes.",
    )
    evaluate.add_argument("model", type=pathlib.Path, help=f"a model .zip, or a run folder (its {MODEL_FILE} is used)")
    _add_env_options(evaluate, f"the one in {RUN_FILE} beside the model or in the model's zip; else required")
    evaluate.add_argument("--episodes", type=positive_int, default=50, help="evaluation episodes (default: 50)")
    evaluate.add_argument("--seed", type=non_negative_int, default=0, help="seed of the env (default: 0)")
    evaluate.add_argument(
        "--stochastic", action="store_true", help="sample actions instead of taking the most likely (deterministic)"
    )
    evaluate.add_argument("--device", type=device, default="auto", help="torch device (default: auto)")
    evaluate.add_argument(
        "--video",
        type=pathlib.Path,
        default=None,
        metavar="OUT.mp4",
        help="record the evaluation episodes into a video (needs moviepy: pip install moviepy)",
    )
    return Parsers(main, train, evaluate)


# --------------------------------------------------------------------------------------------------------------
# Settings of a training run: command line > hyperparameter file > defaults
# --------------------------------------------------------------------------------------------------------------

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
            specs.append(_wrapper(item))
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
    hyperparameters = {name: setting(name, default) for name, default in defaults.items()}
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


# --------------------------------------------------------------------------------------------------------------
# train
# --------------------------------------------------------------------------------------------------------------


class ThrottledHumanOutputFormat(HumanOutputFormat):
    """SB3's stdout table, printed at most every ``every`` env steps (the CSV and TensorBoard get every dump)."""

    def __init__(self, every: int) -> None:
        super().__init__(sys.stdout)
        self.every = every
        self.last_step: int | None = None

    def write(self, key_values: dict[str, Any], key_excluded: dict[str, tuple[str, ...]], step: int = 0) -> None:
        if self.last_step is not None and step - self.last_step < self.every:
            return
        self.last_step = step
        super().write(key_values, key_excluded, step)


def make_logger(settings: TrainSettings) -> Logger:
    """SB3 logger: the throttled table on stdout, progress.csv in --out, TensorBoard under --tensorboard-log."""
    out = pathlib.Path(settings.out)
    formats: list[KVWriter] = [CSVOutputFormat(str(out / "progress.csv"))]
    if settings.verbose >= 1:
        formats.insert(0, ThrottledHumanOutputFormat(settings.print_every))
    if settings.tensorboard_log is not None:
        from stable_baselines3.common.utils import get_latest_run_id

        run_id = get_latest_run_id(settings.tensorboard_log, "IPPO") + 1
        formats.append(TensorBoardOutputFormat(os.path.join(settings.tensorboard_log, f"IPPO_{run_id}")))
    return Logger(folder=str(out), output_formats=formats)


def _probe_episode_length(env_factory: EnvFactory, settings: TrainSettings, limit: int) -> int | None:
    """Steps of one episode with random actions (None if it outlasts ``limit`` steps): what an update costs."""
    probe = make_vec_env(env_factory, n_envs=1, seed=settings.seed, env_kwargs=settings.env_kwargs)
    try:
        max_episode_steps = settings.hyperparameters.get("max_episode_steps")
        if max_episode_steps is not None:
            probe.max_episode_steps = max_episode_steps
        probe.reset()
        for space in probe.action_spaces.values():
            space.seed(settings.seed)
        for length in range(1, limit + 1):
            actions = {agent: np.stack([space.sample()]) for agent, space in probe.action_spaces.items()}
            if probe.step_agents(actions).dones[0]:
                return length
        return None
    finally:
        probe.close()


def estimated_updates(env_factory: EnvFactory, settings: TrainSettings) -> tuple[int, str] | None:
    """About how many updates the run makes, and how that was estimated (from one episode with random actions, the
    copies finishing together); None if that episode outlasts the whole budget."""
    length = _probe_episode_length(env_factory, settings, settings.timesteps)
    if length is None:
        return None
    h = settings.hyperparameters
    per_round = length * settings.n_envs  # env steps in which every copy finishes one episode
    if h["n_steps"] is not None:
        how = f"n_steps={h['n_steps']} transitions, in episodes of about {length} steps with random actions"
        first, per_update = -(-h["n_steps"] // per_round) * per_round, h["n_steps"]
    else:
        chunks = -(-length // h["rollout_len"]) if h["rollout_len"] else 1
        how = f"n_episodes={h['n_episodes']} trajectories, in episodes of about {length} steps with random actions"
        first = -(-h["n_episodes"] // (settings.n_envs * chunks)) * per_round
        per_update = max(h["n_episodes"] * length // chunks, 1)
    updates = 0 if settings.timesteps < first else 1 + (settings.timesteps - first) // per_update
    return updates, how


def _check_log_interval(env_factory: EnvFactory, settings: TrainSettings, parser: argparse.ArgumentParser) -> None:
    if settings.log_interval == 1:
        return  # Any update writes a row.
    estimate = estimated_updates(env_factory, settings)
    if estimate is None:
        return
    updates, how = estimate
    if updates < settings.log_interval:
        parser.error(
            f"argument --log-interval: {settings.log_interval} would write no learning curve: this run makes about "
            f"{updates} updates ({settings.timesteps} env steps, one update per {how}). Use at most --log-interval "
            f"{max(updates // 2, 1)} (two rows or more), or more --timesteps."
        )


def _progress_bar_available() -> bool:
    return importlib.util.find_spec("tqdm") is not None and importlib.util.find_spec("rich") is not None


def _callbacks(settings: TrainSettings, env_factory: EnvFactory) -> tuple[list[Any], list[Any]]:
    """The --checkpoint-freq and --eval-freq callbacks (frequencies in env steps, as rl-zoo counts them), and the
    envs to close after training."""
    from stable_baselines3.common.callbacks import CheckpointCallback

    from sb3_ippo.evaluation import MultiAgentEvalCallback

    out = pathlib.Path(settings.out)
    callbacks: list[Any] = []
    envs: list[Any] = []
    if settings.checkpoint_freq > 0:
        callbacks.append(
            CheckpointCallback(
                save_freq=max(settings.checkpoint_freq // settings.n_envs, 1),
                save_path=str(out / "checkpoints"),
                name_prefix="model",
                verbose=int(settings.verbose >= 2),
            )
        )
    if settings.eval_freq > 0:
        eval_env = make_vec_env(env_factory, n_envs=1, seed=settings.seed + 10_000, env_kwargs=settings.env_kwargs)
        envs.append(eval_env)
        callbacks.append(
            MultiAgentEvalCallback(
                eval_env,
                n_eval_episodes=settings.n_eval_episodes,
                eval_freq=max(settings.eval_freq // settings.n_envs, 1),
                best_model_save_path=str(out),
                log_path=str(out / "eval"),
                verbose=settings.verbose,
                warn=False,
            )
        )
    return callbacks, envs


def _build(settings: TrainSettings, env_factory: EnvFactory, parser: argparse.ArgumentParser) -> IPPO:
    try:
        env = make_vec_env(
            env_factory,
            n_envs=settings.n_envs,
            seed=settings.seed,
            vec_env_cls=settings.vec_env,
            env_kwargs=settings.env_kwargs,
        )
    except (TypeError, ValueError, AssertionError) as error:
        parser.error(f"cannot make the env {settings.env} with env kwargs {settings.env_kwargs}: {error}")
    hyperparameters = {name: schedule(value) for name, value in settings.hyperparameters.items()}
    try:
        return IPPO(
            settings.policy, env, seed=settings.seed, device=settings.device, verbose=settings.verbose, **hyperparameters
        )
    except (TypeError, ValueError) as error:
        env.close()
        parser.error(str(error))


def _record_env_in_zip(model_path: pathlib.Path, settings: TrainSettings) -> None:
    """Add run.json to the model's zip (SB3's loader ignores it), so that ``evaluate`` of the zip alone finds its env."""
    with zipfile.ZipFile(model_path, "a") as archive:
        archive.writestr(RUN_FILE, json.dumps(settings.to_json(), indent=2))


def print_evaluation(result: AgentEvaluation, heading: str) -> None:
    kind = "deterministic" if result.deterministic else "stochastic (sampled)"
    print(f"{heading}: {result.n_episodes} episodes, {kind} actions")
    mean, std = result.team_mean_std()
    width = max([len("team return"), *(len(str(agent)) for agent in result.agent_returns)])
    print(f"  {'team return':<{width}}  {mean:9.2f} +/- {std:.2f}   (episode length {np.mean(result.lengths):.1f})")
    for agent, (agent_mean, agent_std) in result.agent_mean_std().items():
        print(f"  {agent!s:<{width}}  {agent_mean:9.2f} +/- {agent_std:.2f}")


def _plot(out: pathlib.Path, title: str) -> None:
    from sb3_ippo.plotting import plot_learning_curve

    try:
        written = plot_learning_curve(out / "progress.csv", out / "learning_curve.png", title)
    except ImportError:
        print(
            "No learning curve: matplotlib is not installed (pip install matplotlib, or pip install 'sb3_ippo[extra]'); "
            f"the data is in {out / 'progress.csv'}"
        )
        return
    if written:
        print(f"Saved the learning curve to {out / 'learning_curve.png'}")
    else:
        print(f"No learning curve: {out / 'progress.csv'} has no episode return (no log row was written: see above)")


def train(args: argparse.Namespace, parser: argparse.ArgumentParser) -> pathlib.Path:
    import torch as th

    settings = resolve_train_settings(args, parser)
    env_factory = EnvFactory(settings.env, tuple(settings.wrappers))
    try:
        env_factory.check()
    except ValueError as error:
        parser.error(f"argument --env: {error}")
    if settings.tensorboard_log is not None and importlib.util.find_spec("tensorboard") is None:
        parser.error("argument --tensorboard-log: TensorBoard is not installed: pip install tensorboard")
    th.set_num_threads(settings.threads)
    _check_log_interval(env_factory, settings, parser)
    model = _build(settings, env_factory, parser)
    out = pathlib.Path(settings.out)
    out.mkdir(parents=True, exist_ok=True)
    model.set_logger(make_logger(settings))
    (out / RUN_FILE).write_text(json.dumps(settings.to_json(), indent=2) + "\n")
    wrappers = f" with wrappers {' '.join(map(str, settings.wrappers))}" if settings.wrappers else ""
    print(
        f"Training IPPO on {settings.env} {settings.env_kwargs}{wrappers} for {settings.timesteps} env steps; "
        f"output in {out}/"
    )
    callbacks, extra_envs = _callbacks(settings, env_factory)
    try:
        model.learn(
            settings.timesteps,
            callback=callbacks or None,
            log_interval=settings.log_interval,
            progress_bar=not args.no_progress_bar and _progress_bar_available(),
        )
    finally:
        for env in extra_envs:
            env.close()
    model_path = out / MODEL_FILE
    model.save(model_path)
    _record_env_in_zip(model_path, settings)
    print(f"Saved the model to {model_path} and the log to {out / 'progress.csv'}")
    _plot(out, f"IPPO on {settings.env}")
    if settings.eval_episodes > 0:
        eval_env = make_vec_env(env_factory, n_envs=1, seed=settings.seed + 10_000, env_kwargs=settings.env_kwargs)
        with contextlib.closing(eval_env):
            print_evaluation(evaluate_agents(model, eval_env, n_eval_episodes=settings.eval_episodes), "Final evaluation")
    assert model.env is not None
    model.env.close()
    return model_path


# --------------------------------------------------------------------------------------------------------------
# evaluate
# --------------------------------------------------------------------------------------------------------------


def _model_path(path: pathlib.Path, parser: argparse.ArgumentParser) -> pathlib.Path:
    if path.is_dir():
        if not (path / MODEL_FILE).is_file():
            parser.error(f"argument model: the folder {path} has no {MODEL_FILE}: give a model .zip or a run folder")
        return path / MODEL_FILE
    if not path.exists() and path.with_suffix(".zip").is_file():
        return path.with_suffix(".zip")
    if not path.is_file():
        parser.error(f"argument model: No model at {path}")
    if not zipfile.is_zipfile(path):
        parser.error(f"argument model: {path} is not a model zip saved by IPPO")
    return path


def _recorded_run(model_path: pathlib.Path) -> dict[str, Any]:
    """The run the model came from: run.json beside it, else the copy inside its zip, else nothing."""
    beside = model_path.parent / RUN_FILE
    if beside.is_file():
        return json.loads(beside.read_text())
    with zipfile.ZipFile(model_path) as archive:
        if RUN_FILE in archive.namelist():
            return json.loads(archive.read(RUN_FILE))
    return {}


def evaluate(args: argparse.Namespace, parser: argparse.ArgumentParser) -> AgentEvaluation:
    model_path = _model_path(args.model, parser)
    run = _recorded_run(model_path)
    env_id = args.env or run.get("env")
    if env_id is None:
        parser.error(
            f"argument --env: {model_path} has no {RUN_FILE} beside it or inside it (it was not saved by "
            "`python -m sb3_ippo train`), so the env it was trained on is unknown: give it with --env MODULE "
            f"(e.g. --env {DEFAULT_ENV}), and --env-kwargs / --wrappers as in training"
        )
    from_run = args.env is None or args.env == run.get("env")
    if args.env_kwargs is not None:
        env_kwargs = dict(args.env_kwargs)
    elif from_run and "env_kwargs" in run:
        env_kwargs = dict(run["env_kwargs"])
    else:
        env_kwargs = dict(DEFAULT_ENV_KWARGS) if env_id == DEFAULT_ENV else {}
    if args.wrappers is not None:
        wrappers = list(args.wrappers)
    else:
        try:
            wrappers = [_wrapper(text) for text in run.get("wrappers", [])] if from_run else []
        except ValueError as error:
            parser.error(f"the wrappers recorded in {RUN_FILE} cannot be used: {error}")
    env_factory = EnvFactory(env_id, tuple(wrappers))
    try:
        env_factory.check()
    except ValueError as error:
        parser.error(f"argument --env: {error}")
    heading = f"{env_id} {env_kwargs}" + (f" with wrappers {' '.join(map(str, wrappers))}" if wrappers else "")
    if args.video is not None:
        if importlib.util.find_spec("moviepy") is None:
            parser.error("argument --video: recording needs moviepy: pip install moviepy (or pip install 'sb3_ippo[extra]')")
        env_kwargs = {**env_kwargs, "render_mode": "rgb_array"}
    try:
        env = make_vec_env(env_factory, n_envs=1, seed=args.seed, env_kwargs=env_kwargs)
    except (TypeError, ValueError, AssertionError) as error:
        parser.error(f"cannot make the env {env_id} with env kwargs {env_kwargs}: {error}")
    try:
        model = IPPO.load(model_path, env=env, device=args.device)
    except ValueError as error:
        env.close()
        parser.error(
            f"{model_path} does not fit the env {env_id} {env_kwargs}: {error}. Give the env it was trained on "
            "with --env, --env-kwargs and --wrappers."
        )
    deterministic = not args.stochastic
    if args.video is None:
        with contextlib.closing(env):
            result = evaluate_agents(model, env, n_eval_episodes=args.episodes, deterministic=deterministic)
    else:
        result = _evaluate_on_video(model, env, args.video, args.episodes, deterministic)
    print_evaluation(result, heading)
    if args.video is not None:
        print(f"Saved the video of the {result.n_episodes} episodes to {args.video}")
    return result


def _evaluate_on_video(model: IPPO, env: Any, video: pathlib.Path, episodes: int, deterministic: bool) -> AgentEvaluation:
    """Evaluate through SB3's ``VecVideoRecorder``, which records every frame of the episodes into ``video``."""
    from stable_baselines3.common.vec_env import VecVideoRecorder

    video.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=video.parent) as folder:
        recorder = VecVideoRecorder(
            env, folder, record_video_trigger=lambda step: step == 0, video_length=sys.maxsize, name_prefix="evaluation"
        )
        try:
            result = evaluate_agents(model, recorder, n_eval_episodes=episodes, deterministic=deterministic)
        finally:
            # Closing writes the video; MoviePy's progress messages would name the temporary file.
            chatter = io.StringIO()
            try:
                with contextlib.redirect_stdout(chatter), contextlib.redirect_stderr(chatter):
                    recorder.close()
            except Exception:
                print(chatter.getvalue(), file=sys.stderr)
                raise
        pathlib.Path(recorder.video_path).replace(video)
    return result


def main(argv: Sequence[str] | None = None) -> int:
    # pygame (butterfly envs, rendering) needs no display with the dummy video driver.
    if "DISPLAY" not in os.environ:
        os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
    os.environ.setdefault("PYGAME_HIDE_SUPPORT_PROMPT", "1")
    parsers = build_parser()
    args = parsers.main.parse_args(argv)
    if args.command == "train":
        train(args, parsers.train)
    else:
        evaluate(args, parsers.evaluate)
    return 0


if __name__ == "__main__":
    sys.exit(main())
