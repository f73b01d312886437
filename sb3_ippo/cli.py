"""Command line: ``python -m sb3_ippo train`` and ``python -m sb3_ippo evaluate MODEL.zip``."""

from __future__ import annotations

import argparse
import ast
import csv
import importlib
import inspect
import json
import pathlib
import re
import sys
from collections.abc import Callable, Sequence
from typing import Any

from sb3_ippo.evaluation import evaluate_policy
from sb3_ippo.ippo import IPPO
from sb3_ippo.turn_based import is_turn_based_vec_env
from sb3_ippo.vec_env import make_vec_env

DEFAULT_ENV = "mpe2.simple_spread_v3"
DEFAULT_ENV_KWARGS: dict[str, Any] = {"N": 3, "max_cycles": 25}
RUN_FILE = "run.json"
# Hyperparameters for envs where IPPO's defaults do not fit; options on the command line override them.
# Two-player board games: self-play with one shared network (docs/games.md; benchmarks/games.py measured them).
GAME_DEFAULTS: dict[str, Any] = {"share_parameters": True}
ENV_DEFAULTS: dict[str, dict[str, Any]] = {
    "pettingzoo.classic.tictactoe_v3": GAME_DEFAULTS,
    "pettingzoo.classic.connect_four_v3": GAME_DEFAULTS,
}
# IPPO arguments that are not hyperparameters, or that have an option of their own.
_NOT_HYPERPARAMETERS = {"policy", "env", "seed", "verbose", "device", "tensorboard_log", "_init_setup_model"}


def literal(text: str) -> Any:
    """A Python literal (number, bool, None, list, dict, ``dict(key=literal, ...)``), or the text itself."""
    try:
        node = ast.parse(text, mode="eval").body
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "dict" and not node.args:
            return {keyword.arg: ast.literal_eval(keyword.value) for keyword in node.keywords}
        return ast.literal_eval(node)
    except (ValueError, SyntaxError, TypeError):
        return text


def parse_env_kwargs(pairs: Sequence[str]) -> dict[str, Any]:
    kwargs = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise argparse.ArgumentTypeError(f"env kwargs are KEY=VALUE pairs (e.g. N=3 max_cycles=25), got {pair!r}")
        kwargs[key] = literal(value)
    return kwargs


def load_env_fn(env_id: str) -> Callable[..., Any]:
    """``"mpe2.simple_spread_v3"`` -> ``simple_spread_v3.parallel_env`` (or ``.env`` if it has no parallel_env)."""
    try:
        module = importlib.import_module(env_id)
    except ImportError as error:
        raise SystemExit(
            f"Cannot import the env module {env_id!r} ({error}). Give a PettingZoo env module, "
            "e.g. mpe2.simple_spread_v3 or pettingzoo.butterfly.pistonball_v6."
        ) from error
    env_fn = getattr(module, "parallel_env", None) or getattr(module, "env", None)
    if env_fn is None:
        raise SystemExit(f"The module {env_id!r} has neither parallel_env() nor env(): it is not a PettingZoo env module.")
    return env_fn


def _hyperparameter_help() -> dict[str, str]:
    """The first sentence of each ``:param name:`` of IPPO's docstring, for --help."""
    doc = inspect.getdoc(IPPO) or ""
    helps = {}
    for match in re.finditer(r":param (\w+): (.*?)(?=\n\s*:param|\Z)", doc, flags=re.S):
        text = " ".join(match.group(2).split())
        helps[match.group(1)] = text.split(". ")[0].replace("%", "%%")
    return helps


def _add_hyperparameters(parser: argparse.ArgumentParser) -> list[str]:
    group = parser.add_argument_group("IPPO hyperparameters (default: IPPO's)")
    helps = _hyperparameter_help()
    names = []
    for name, parameter in inspect.signature(IPPO.__init__).parameters.items():
        if name in _NOT_HYPERPARAMETERS or name == "self":
            continue
        names.append(name)
        group.add_argument(
            "--" + name.replace("_", "-"),
            dest=name,
            type=literal,
            default=None,
            metavar="VALUE",
            help=f"{helps.get(name, '')} (default: {parameter.default!r})",
        )
    return names


def build_parser() -> tuple[argparse.ArgumentParser, list[str]]:
    parser = argparse.ArgumentParser(prog="python -m sb3_ippo", description="Independent PPO for PettingZoo envs")
    commands = parser.add_subparsers(dest="command", required=True)

    train = commands.add_parser("train", help="train IPPO; save the model, a CSV log and a learning curve")
    train.add_argument("--env", default=DEFAULT_ENV, help=f"PettingZoo env module (default: {DEFAULT_ENV})")
    train.add_argument(
        "--env-kwargs", nargs="*", default=None, metavar="KEY=VALUE", help=f"env arguments (default: {DEFAULT_ENV_KWARGS})"
    )
    train.add_argument("--timesteps", type=int, default=200_000, help="env steps to train for (default: 200000)")
    train.add_argument("--n-envs", type=int, default=8, help="env copies stepped together (default: 8)")
    train.add_argument("--vec-env", choices=["dummy", "subproc"], default="dummy", help="run copies in-process or in workers")
    train.add_argument("--policy", default="MlpPolicy", help="MlpPolicy, CnnPolicy or MultiInputPolicy")
    train.add_argument("--seed", type=int, default=0)
    train.add_argument("--out", default=None, help="output folder (default: runs/ippo_<env name>)")
    train.add_argument("--eval-episodes", type=int, default=50, help="episodes of the final evaluation (0: none)")
    train.add_argument("--no-progress-bar", action="store_true", help="do not show a progress bar")
    train.add_argument("--log-interval", type=int, default=1, help="log (stdout and CSV) every N updates (default: 1)")
    train.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads (default: 1, several times faster than more for small networks on a few cores)",
    )
    hyperparameters = _add_hyperparameters(train)

    evaluate = commands.add_parser("evaluate", help="print the mean and std of a saved model's team return")
    evaluate.add_argument("model", help="path of a model .zip saved by IPPO")
    evaluate.add_argument(
        "--env", default=None, help=f"PettingZoo env module (default: the one in {RUN_FILE}, else {DEFAULT_ENV})"
    )
    evaluate.add_argument("--env-kwargs", nargs="*", default=None, metavar="KEY=VALUE")
    evaluate.add_argument("--episodes", type=int, default=50)
    evaluate.add_argument("--seed", type=int, default=0)
    evaluate.add_argument("--stochastic", action="store_true", help="sample actions instead of taking the most likely")
    return parser, hyperparameters


def plot_learning_curve(csv_path: pathlib.Path, png_path: pathlib.Path, title: str) -> bool:
    """Team return against env steps, from the SB3 CSV log. Returns False when there is nothing to plot."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps, returns = [], []
    with csv_path.open() as file:
        for row in csv.DictReader(file):
            if row.get("rollout/ep_rew_mean") and row.get("time/total_timesteps"):
                steps.append(float(row["time/total_timesteps"]))
                returns.append(float(row["rollout/ep_rew_mean"]))
    if not steps:
        return False
    figure, axis = plt.subplots(figsize=(7, 4))
    axis.plot(steps, returns)
    axis.set_xlabel("env steps")
    axis.set_ylabel("team return (mean of last episodes)")
    axis.set_title(title)
    axis.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(png_path, dpi=120)
    plt.close(figure)
    return True


def _progress_bar_available() -> bool:
    try:
        import rich  # noqa: F401
        import tqdm  # noqa: F401
    except ImportError:
        return False
    return True


def train(args: argparse.Namespace, hyperparameter_names: list[str]) -> pathlib.Path:
    import torch as th
    from stable_baselines3.common.logger import configure

    th.set_num_threads(args.threads)

    env_kwargs = (
        parse_env_kwargs(args.env_kwargs)
        if args.env_kwargs is not None
        else (dict(DEFAULT_ENV_KWARGS) if args.env == DEFAULT_ENV else {})
    )
    out = pathlib.Path(args.out or f"runs/ippo_{args.env.split('.')[-1]}")
    out.mkdir(parents=True, exist_ok=True)
    env_fn = load_env_fn(args.env)
    env = make_vec_env(env_fn, n_envs=args.n_envs, seed=args.seed, vec_env_cls=args.vec_env, env_kwargs=env_kwargs)
    hyperparameters = {name: getattr(args, name) for name in hyperparameter_names if getattr(args, name) is not None}
    hyperparameters = {**ENV_DEFAULTS.get(args.env, {}), **hyperparameters}
    if not isinstance(hyperparameters.get("policy_kwargs", {}), dict):
        raise SystemExit(f"--policy-kwargs takes a dict, e.g. \"dict(net_arch=[64, 64])\", got {args.policy_kwargs!r}")
    model = IPPO(args.policy, env, seed=args.seed, verbose=1, **hyperparameters)
    model.set_logger(configure(str(out), ["stdout", "csv"]))
    (out / RUN_FILE).write_text(
        json.dumps(
            {"env": args.env, "env_kwargs": env_kwargs, "timesteps": args.timesteps, "hyperparameters": hyperparameters},
            indent=2,
        )
    )
    print(f"Training IPPO on {args.env} {env_kwargs} for {args.timesteps} env steps; output in {out}/")
    model.learn(
        args.timesteps, log_interval=args.log_interval, progress_bar=not args.no_progress_bar and _progress_bar_available()
    )
    model_path = out / "model.zip"
    model.save(model_path)
    print(f"Saved the model to {model_path} and the log to {out / 'progress.csv'}")
    if plot_learning_curve(out / "progress.csv", out / "learning_curve.png", f"IPPO on {args.env}"):
        print(f"Saved the learning curve to {out / 'learning_curve.png'}")
    if args.eval_episodes > 0:
        eval_env = make_vec_env(env_fn, n_envs=1, seed=args.seed + 10_000, env_kwargs=env_kwargs)
        if is_turn_based_vec_env(eval_env):  # a game: its team return says nothing; its results against random do
            print_game_results(model, eval_env, args.eval_episodes)
        else:
            mean, std = evaluate_policy(model, eval_env, n_eval_episodes=args.eval_episodes, warn=False)
            print(f"Team return over {args.eval_episodes} evaluation episodes: {mean:.2f} +/- {std:.2f}")
        eval_env.close()
    env.close()
    return model_path


def print_game_results(model: IPPO, env: Any, n_games: int, deterministic: bool = True) -> None:
    """Each seat's win, draw and loss rates against a uniformly random opponent."""
    records = evaluate_policy(model, env, n_eval_episodes=n_games, deterministic=deterministic, opponent="random")
    assert isinstance(records, dict)
    for seat, record in records.items():
        print(f"{seat} against random: {record}")


def evaluate(args: argparse.Namespace) -> tuple[float, float]:
    model_path = pathlib.Path(args.model)
    if not model_path.exists() and model_path.with_suffix(".zip").exists():
        model_path = model_path.with_suffix(".zip")
    if not model_path.exists():
        raise SystemExit(f"No model at {args.model}")
    run_file = model_path.parent / RUN_FILE
    run = json.loads(run_file.read_text()) if run_file.exists() else {}
    env_id = args.env or run.get("env", DEFAULT_ENV)
    if args.env_kwargs is not None:
        env_kwargs = parse_env_kwargs(args.env_kwargs)
    elif args.env is None and "env_kwargs" in run:
        env_kwargs = run["env_kwargs"]
    else:
        env_kwargs = dict(DEFAULT_ENV_KWARGS) if env_id == DEFAULT_ENV else {}
    env = make_vec_env(load_env_fn(env_id), n_envs=1, seed=args.seed, env_kwargs=env_kwargs)
    model = IPPO.load(model_path, env=env)
    if is_turn_based_vec_env(env):
        print_game_results(model, env, args.episodes, deterministic=not args.stochastic)
    mean, std = evaluate_policy(model, env, n_eval_episodes=args.episodes, deterministic=not args.stochastic, warn=False)
    print(f"{env_id} {env_kwargs}: team return over {args.episodes} episodes: {mean:.2f} +/- {std:.2f}")
    env.close()
    return float(mean), float(std)  # type: ignore[arg-type]


def main(argv: Sequence[str] | None = None) -> int:
    parser, hyperparameter_names = build_parser()
    args = parser.parse_args(argv)
    if args.command == "train":
        train(args, hyperparameter_names)
    else:
        evaluate(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
