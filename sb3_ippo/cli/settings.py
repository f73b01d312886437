"""The settings of a training run: command line > hyperparameter file (rl-zoo's YAML format) > the packaged tuned
settings of the env (``sb3_ippo/hyperparams/ippo.yml``) > defaults. ``TrainSettings`` is what run.json holds, and its
``argv`` re-runs the training."""

from __future__ import annotations

import argparse
import dataclasses
import pathlib
import shlex
from typing import Any

from sb3_ippo.cli.values import jsonable, to_text
from sb3_ippo.common.env_factory import WrapperSpec
from sb3_ippo.hyperparams.files import TUNED_FILE, hyperparameter_defaults, hyperparameter_types, read_hyperparams_file
from sb3_ippo.version import __version__

DEFAULT_ENV = "mpe2.simple_spread_v3"
DEFAULT_ENV_KWARGS: dict[str, Any] = {"N": 3, "max_cycles": 25}
RUN_FILE = "run.json"
MODEL_FILE = "model.zip"
CHECKPOINT_FOLDER = "checkpoints"  # where train --checkpoint-freq writes, inside --out
# Defaults of the train options that a hyperparameter file may also set (the command line wins over the file).
TRAIN_DEFAULTS: dict[str, Any] = {"timesteps": 200_000, "n_envs": 8, "vec_env": "dummy", "policy": "MlpPolicy"}
PRINT_EVERY = 10_000  # env steps between two lines on stdout: 20 lines for the default 200,000
# A game's team return is 0 whoever wins: without --eval-freq, train measures the win rate against a random player
# this many times in a run (the learning curve's points), with this many games per seat each time.
GAME_EVALUATIONS = 10
GAME_EVAL_EPISODES = 20
# The algorithms `train --algo` offers, by their command-line name: the class's module and name.
ALGORITHMS: dict[str, tuple[str, str]] = {"ippo": ("sb3_ippo.ippo", "IPPO"), "mappo": ("sb3_ippo.mappo", "MAPPO")}


@dataclasses.dataclass
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
    eval_freq: int | None  # None until the env is known: see with_game_defaults
    n_eval_episodes: int | None
    eval_episodes: int
    out: str
    wandb_project: str | None = None
    algo: str = "ippo"
    critic_input: str | None = None  # --algo mappo: "state" or "joint_obs"

    @property
    def algorithm_name(self) -> str:
        """The class name of the algorithm: IPPO or MAPPO."""
        return ALGORITHMS[self.algo][1]

    def with_game_defaults(self, game: bool) -> TrainSettings:
        """The settings with ``--eval-freq`` and ``--n-eval-episodes`` resolved where not given: for a game
        (turn-based env), GAME_EVALUATIONS win-rate evaluations of GAME_EVAL_EPISODES games per seat; else none, and
        5 episodes."""
        eval_freq = self.eval_freq
        if eval_freq is None:
            eval_freq = max(self.timesteps // GAME_EVALUATIONS, 1) if game else 0
        n_eval_episodes = self.n_eval_episodes
        if n_eval_episodes is None:
            n_eval_episodes = GAME_EVAL_EPISODES if game else 5
        return dataclasses.replace(self, eval_freq=eval_freq, n_eval_episodes=n_eval_episodes)

    def argv(self) -> list[str]:
        """The ``train`` arguments that reproduce this run: every setting explicit (no hyperparameter file, every
        hyperparameter even at its default, in case a default changes), except ``--out``."""
        env_kwargs = [f"{key}={to_text(value)}" for key, value in self.env_kwargs.items()]
        argv = ["train", "--env", self.env, "--env-kwargs", *env_kwargs]
        if self.wrappers:
            argv += ["--wrappers", *(str(spec.resolved()) for spec in self.wrappers)]
        options = {
            "algo": self.algo,
            "critic_input": self.critic_input,
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
            "wandb_project": self.wandb_project,
            **self.hyperparameters,
        }
        for name, value in options.items():
            if value is not None or name in self.hyperparameters:
                argv += ["--" + name.replace("_", "-"), to_text(value)]
        return argv

    def to_json(self) -> dict[str, Any]:
        argv = self.argv()
        return {
            "sb3_ippo_version": __version__,
            "out": self.out,
            "command": shlex.join(["python", "-m", "sb3_ippo", *argv]),
            "argv": argv,
            "algo": self.algo,
            "critic_input": self.critic_input,
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
                "wandb_project": self.wandb_project,
            },
        }


def default_run_folder(algo: str, env_id: str) -> pathlib.Path:
    """Where a run without ``--out`` goes, before numbering: ``runs/<algo>_<env name>``."""
    return pathlib.Path("runs") / f"{algo}_{env_id.split('.')[-1]}"


def numbered_run_folder(base: pathlib.Path) -> pathlib.Path:
    """``base`` if it does not exist yet, else the first of ``base_2``, ``base_3``, ... that does not: the default
    ``--out`` of each run, so that a second run never writes over the first (rl-zoo numbers its log folders so)."""
    if not base.exists():
        return base
    number = 2
    while base.with_name(f"{base.name}_{number}").exists():
        number += 1
    return base.with_name(f"{base.name}_{number}")


def claim_run_folder(base: pathlib.Path) -> pathlib.Path:
    """Create the first free numbered folder of ``base`` (see :func:`numbered_run_folder`) and return it. Creating it
    is the claim: of two runs started at once, the second finds it taken and goes on to the next number."""
    while True:
        folder = numbered_run_folder(base)
        try:
            folder.mkdir(parents=True)
        except FileExistsError:
            continue
        return folder


def resolve_train_settings(args: argparse.Namespace, parser: argparse.ArgumentParser) -> TrainSettings:
    """Merge the command line, the hyperparameter file, the tuned settings and the defaults; any mistake is a usage
    error."""
    env_id = args.env or DEFAULT_ENV
    defaults = hyperparameter_defaults()
    types = hyperparameter_types()
    # The packaged tuned settings for the env, under the user's file: each key of the user's section replaces the
    # tuned one whole.
    from_file = read_hyperparams_file(TUNED_FILE, env_id, types, required=False)
    if args.hyperparams is not None:
        try:
            from_file.update(read_hyperparams_file(args.hyperparams, env_id, types))
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
    algo = getattr(args, "algo", "ippo")
    critic_input = getattr(args, "critic_input", None)
    if critic_input is not None and algo != "mappo":
        parser.error("argument --critic-input: only --algo mappo has a centralized critic")
    if algo == "mappo" and critic_input is None:
        critic_input = "state"
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
        wandb_project=args.wandb_project,
        out=str(args.out or numbered_run_folder(default_run_folder(algo, env_id))),
        algo=algo,
        critic_input=critic_input,
    )
