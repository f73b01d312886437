"""The argument parser of ``python -m sb3_ippo``: ``train`` (every IPPO hyperparameter an option, with its whole
docstring and default in --help) and ``evaluate``."""

from __future__ import annotations

import argparse
import difflib
import inspect
import pathlib
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NoReturn


from sb3_ippo.cli.settings import (
    ALGORITHMS,
    DEFAULT_ENV,
    DEFAULT_ENV_KWARGS,
    GAME_EVAL_EPISODES,
    GAME_EVALUATIONS,
    MODEL_FILE,
    PRINT_EVERY,
    RUN_FILE,
    TRAIN_DEFAULTS,
)
from sb3_ippo.cli.values import device, env_kwarg, non_negative_int, positive_int, wrapper_spec
from sb3_ippo.hyperparams.files import NOT_HYPERPARAMETERS
from sb3_ippo.hyperparams.text import hyperparameter_type
from sb3_ippo.ippo import IPPO
from sb3_ippo.version import __version__


def _hyperparameter_help() -> dict[str, str]:
    """Each ``:param name:`` of IPPO's docstring, whole, for --help."""
    doc = inspect.getdoc(IPPO) or ""
    helps = {}
    for match in re.finditer(r":param (\w+): (.*?)(?=\n\s*:param|\Z)", doc, flags=re.S):
        helps[match.group(1)] = " ".join(match.group(2).split()).replace("%", "%%")
    return helps


def _add_hyperparameters(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        "IPPO hyperparameters",
        "Every IPPO argument; the command line wins over --hyperparams, which wins over IPPO's\n"
        "default. None is written None; schedules as lin_<start> (linear decay to 0).",
    )
    helps = _hyperparameter_help()
    for name, parameter in inspect.signature(IPPO.__init__).parameters.items():
        if name in NOT_HYPERPARAMETERS or name == "self":
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
  python -m sb3_ippo train --hyperparams spread.yml          # a file you write: a section per env id (below)

hyperparameter file (YAML), one section per env id (the full module name or its last part):
  mpe2.simple_spread_v3:
    n_timesteps: 500000        # or timesteps
    n_envs: 8
    policy: MlpPolicy
    env_kwargs: {{N: 3, max_cycles: 25}}
    wrappers: [color_reduction, "resize:x_size=64,y_size=64"]
    learning_rate: lin_1e-3
    policy_kwargs: "dict(net_arch=[64, 64])"

logging: every update writes a row with every key to progress.csv (and TensorBoard with --tensorboard-log); stdout
shows a progress bar and, every --print-every env steps, one summary line (SB3's full table with --verbose 2).
"""


class Parser(argparse.ArgumentParser):
    """argparse's parser with short errors: what was wrong and what is expected first, then a one-line usage hint
    instead of the whole usage block (which ``--help`` shows)."""

    def error(self, message: str) -> NoReturn:
        positionals = " ".join(
            action.metavar if isinstance(action.metavar, str) else action.dest for action in self._get_positional_actions()
        )
        hint = f"usage: {self.prog} {positionals + ' ' if positionals else ''}[options] ({self.prog} --help lists them)"
        self.exit(2, f"{self.prog}: error: {message}\n{hint}\n")


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
    # allow_abbrev=False: a misspelled option (--timestep) is an error, not silently the option it is a prefix of.
    main = Parser(
        prog="python -m sb3_ippo",
        allow_abbrev=False,
        description="Independent PPO (IPPO) for PettingZoo multi-agent envs, as a Stable-Baselines3 algorithm.",
    )
    main.add_argument("--version", action="version", version=f"sb3_ippo {__version__}")
    commands = main.add_subparsers(dest="command", required=True, metavar="{train,evaluate}")

    train = commands.add_parser(
        "train",
        allow_abbrev=False,
        help="train IPPO; save the model, a CSV log, a learning curve and run.json",
        description="Train IPPO and write model.zip, progress.csv, learning_curve.png and run.json into --out, "
        "then evaluate the model.",
        epilog=TRAIN_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_env_options(train, DEFAULT_ENV)
    train.add_argument(
        "--hyperparams", type=pathlib.Path, metavar="FILE.yml", help="YAML file, a section per env id (see below)"
    )
    train.add_argument(
        "--resume",
        type=pathlib.Path,
        default=None,
        metavar="RUN_FOLDER",
        help=f"continue the run in RUN_FOLDER (its --out; e.g. one stopped by Ctrl-C) from its {MODEL_FILE} up to its "
        f"budget, with the settings of its {RUN_FILE}, appending to its progress.csv; only --timesteps (a new budget, "
        "in env steps in all) and --no-progress-bar may be given with it",
    )
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
        "--algo",
        choices=list(ALGORITHMS),
        default="ippo",
        help="ippo, or mappo: the same actors with a centralized critic (docs/algorithm.md, 'IPPO or MAPPO') (default: ippo)",
    )
    train.add_argument(
        "--critic-input",
        choices=["state", "joint_obs"],
        default=None,
        help="--algo mappo: what the critic sees, the env's state() or every agent's observation (default: state)",
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
        help="0: nothing on stdout while training; 1: a summary line every --print-every env steps; 2: SB3's full "
        "table (per-agent keys included) instead (default: 1). progress.csv and TensorBoard get every key anyway",
    )
    train.add_argument(
        "--out",
        type=pathlib.Path,
        default=None,
        help="output folder; refused if it holds a model from an earlier run, unless --overwrite (default: "
        "runs/ippo_<env name>, or runs/ippo_<env name>_2, _3, ... if that exists, as rl-zoo numbers its runs)",
    )
    train.add_argument(
        "--overwrite",
        action="store_true",
        help="let --out be a folder that holds a model from an earlier run, and replace that run's files (its "
        "checkpoints, evaluations and best model are deleted first; other files in the folder stay)",
    )
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
        help="print the summary line (the table at --verbose 2) on stdout at the first log at or after every multiple "
        f"of this many env steps; 0: at every log (default: {PRINT_EVERY})",
    )
    train.add_argument(
        "--tensorboard-log",
        type=pathlib.Path,
        default=None,
        metavar="DIR",
        help="also log to TensorBoard in DIR/IPPO_<n> (or MAPPO_<n>)",
    )
    train.add_argument(
        "--wandb-project",
        default=None,
        metavar="PROJECT",
        help="track the run with Weights & Biases in PROJECT (needs wandb: pip install 'sb3_ippo[wandb]'): every "
        "logger key through TensorBoard (in --tensorboard-log, else OUT/tensorboard), run.json as the config, and the "
        "model and logs uploaded at the end; WANDB_MODE=offline keeps the run in OUT/wandb (wandb sync uploads it)",
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
        default=None,
        metavar="ENV_STEPS",
        help="evaluate on a separate env every this many env steps, log eval/mean_reward (for a game: eval/win_rate "
        "against a random player) and keep OUT/best_model.zip; 0: never (default: never, except for a game: "
        f"{GAME_EVALUATIONS} times in the run, for its learning curve of the win rate)",
    )
    train.add_argument(
        "--n-eval-episodes",
        type=positive_int,
        default=None,
        help=f"episodes of each --eval-freq evaluation (default: 5; for a game {GAME_EVAL_EPISODES} games per seat)",
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
        allow_abbrev=False,
        help="print a saved model's team and per-agent returns",
        description="Evaluate a saved model: team return and each agent's return, mean and std over --episodes.",
    )
    evaluate.add_argument(
        "model", type=pathlib.Path, help=f"a model .zip or .safetensors file, or a run folder (its {MODEL_FILE} is used)"
    )
    _add_env_options(evaluate, f"the one in {RUN_FILE} beside the model or in the model's zip; else required")
    evaluate.add_argument("--episodes", type=positive_int, default=50, help="evaluation episodes (default: 50)")
    evaluate.add_argument(
        "--seed",
        type=non_negative_int,
        default=0,
        help="seed of the env, of --stochastic actions and of the random opponent of games (default: 0)",
    )
    evaluate.add_argument(
        "--stochastic", action="store_true", help="sample actions instead of taking the most likely (deterministic)"
    )
    evaluate.add_argument("--device", type=device, default="auto", help="torch device (default: auto)")
    evaluate.add_argument(
        "--video",
        type=pathlib.Path,
        default=None,
        metavar="OUT.mp4",
        help="record the evaluation episodes into a video (needs moviepy: pip install moviepy). A relative path is "
        "inside the model's run folder (e.g. runs/ippo_simple_spread_v3/OUT.mp4), as rl-zoo keeps a run's videos in its "
        "log folder; an absolute path (e.g. $PWD/OUT.mp4) is used as given",
    )
    return Parsers(main, train, evaluate)


def parse_args(parsers: Parsers, argv: Sequence[str] | None) -> argparse.Namespace:
    """The parsed command line; arguments the subcommand does not know are a usage error of that subcommand (its
    usage line, not the top-level one) that suggests the closest of its options for each unknown option."""
    args, unknown = parsers.main.parse_known_args(argv)
    if unknown:
        parser = parsers.train if args.command == "train" else parsers.evaluate
        parser.error(unrecognized_arguments_message(parser, unknown))
    if args.command == "train" and args.resume is not None:
        given = {token.split("=", 1)[0] for token in (sys.argv[1:] if argv is None else argv) if token.startswith("--")}
        others = sorted(given - RESUME_OPTIONS)
        if others:
            parsers.train.error(
                f"argument --resume: the run's settings come from its {RUN_FILE}; only --timesteps (a new budget) and "
                f"--no-progress-bar go with --resume, not {' '.join(others)}"
            )
    return args


RESUME_OPTIONS = {"--resume", "--timesteps", "--no-progress-bar"}  # the options train --resume takes


def unrecognized_arguments_message(parser: argparse.ArgumentParser, unknown: Sequence[str]) -> str:
    """argparse's "unrecognized arguments" message, with "did you mean" and the closest option of ``parser`` for each
    unknown option that is close to one (``difflib.get_close_matches``)."""
    options = [option for action in parser._actions for option in action.option_strings if option.startswith("--")]
    hints = []
    for argument in unknown:
        if not argument.startswith("--"):
            continue
        name = argument.split("=", 1)[0]
        close = difflib.get_close_matches(name, options, n=1)
        if close:
            hints.append(f"{name}: did you mean {close[0]}?")
    return "unrecognized arguments: " + " ".join(unknown) + "".join(f"; {hint}" for hint in hints)
