"""``python -m sb3_ippo train``: build the env and the model from the settings, train with the SB3 logger (a
throttled table on stdout, a CSV row per update, TensorBoard), save the model, run.json and the learning curve,
then evaluate."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import pathlib
import sys
import zipfile
from typing import Any

import numpy as np
from stable_baselines3.common.logger import CSVOutputFormat, HumanOutputFormat, KVWriter, Logger, TensorBoardOutputFormat

from sb3_ippo.cli.evaluate import print_evaluation, print_game_results
from sb3_ippo.cli.settings import ALGORITHMS, CHECKPOINT_FOLDER, MODEL_FILE, RUN_FILE, TrainSettings, resolve_train_settings
from sb3_ippo.cli.values import env_error, installed
from sb3_ippo.env_factory import EnvFactory
from sb3_ippo.evaluation import evaluate_agents
from sb3_ippo.hyperparameters import check_hyperparameters
from sb3_ippo.hyperparams.text import schedule
from sb3_ippo.ippo import IPPO
from sb3_ippo.vec_env.turn_based import is_turn_based_vec_env
from sb3_ippo.vec_env import make_vec_env


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

        name = settings.algorithm_name
        run_id = get_latest_run_id(settings.tensorboard_log, name) + 1
        formats.append(TensorBoardOutputFormat(os.path.join(settings.tensorboard_log, f"{name}_{run_id}")))
    return Logger(folder=str(out), output_formats=formats)


PROBE_STEPS = 10_000  # longer episodes are not measured: the --log-interval check is skipped


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
    length = _probe_episode_length(env_factory, settings, min(settings.timesteps, PROBE_STEPS))
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
    try:
        estimate = estimated_updates(env_factory, settings)
    except (TypeError, ValueError, AssertionError) as error:
        parser.error(env_error(settings.env, settings.env_kwargs, settings.wrappers, error))
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
    return installed("tqdm") and installed("rich")


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
                save_path=str(out / CHECKPOINT_FOLDER),
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
                # A game's team return is 0 whoever wins: score by the win rate against a random player instead.
                opponent="random" if is_turn_based_vec_env(eval_env) else None,
            )
        )
    return callbacks, envs


def algorithm_class(algo: str) -> type[IPPO]:
    """The class of ``--algo``: IPPO, or MAPPO (a subclass)."""
    module, name = ALGORITHMS[algo]
    return getattr(importlib.import_module(module), name)


def _build(settings: TrainSettings, env_factory: EnvFactory, parser: argparse.ArgumentParser) -> IPPO:
    try:
        env = make_vec_env(
            env_factory,
            n_envs=settings.n_envs,
            seed=settings.seed,
            vec_env_cls=settings.vec_env,
            env_kwargs=settings.env_kwargs,
            critic_input=settings.critic_input,
        )
    except (TypeError, ValueError, AssertionError) as error:
        parser.error(env_error(settings.env, settings.env_kwargs, settings.wrappers, error))
    hyperparameters = {name: schedule(value) for name, value in settings.hyperparameters.items()}
    if settings.critic_input is not None:
        hyperparameters["critic_input"] = settings.critic_input
    try:
        return algorithm_class(settings.algo)(
            settings.policy, env, seed=settings.seed, device=settings.device, verbose=settings.verbose, **hyperparameters
        )
    except (TypeError, ValueError) as error:
        env.close()
        parser.error(str(error))


def _record_env_in_zip(model_path: pathlib.Path, settings: TrainSettings) -> None:
    """Add run.json to the model's zip (SB3's loader ignores it), so that ``evaluate`` of the zip alone finds its env."""
    with zipfile.ZipFile(model_path, "a") as archive:
        archive.writestr(RUN_FILE, json.dumps(settings.to_json(), indent=2))


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
    if settings.tensorboard_log is not None and not installed("tensorboard"):
        parser.error("argument --tensorboard-log: TensorBoard is not installed: pip install tensorboard")
    out = pathlib.Path(settings.out)
    if out.exists() and not out.is_dir():
        parser.error(f"argument --out: {out} is a file, not a folder")
    if (out / MODEL_FILE).exists() and not args.overwrite:
        parser.error(
            f"argument --out: {out} already holds {MODEL_FILE} from an earlier run: give another --out (without --out, "
            "each run gets a new numbered folder under runs/), or --overwrite to replace that run's files"
        )
    try:
        # The combinations (each value was checked when parsed), before anything is built.
        check_hyperparameters({name: schedule(value) for name, value in settings.hyperparameters.items()})
    except ValueError as error:
        parser.error(str(error))
    th.set_num_threads(settings.threads)
    _check_log_interval(env_factory, settings, parser)
    model = _build(settings, env_factory, parser)
    out.mkdir(parents=True, exist_ok=True)
    model.set_logger(make_logger(settings))
    (out / RUN_FILE).write_text(json.dumps(settings.to_json(), indent=2) + "\n")
    wrappers = f" with wrappers {' '.join(map(str, settings.wrappers))}" if settings.wrappers else ""
    print(
        f"Training {settings.algorithm_name} on {settings.env} {settings.env_kwargs}{wrappers} for {settings.timesteps} "
        f"env steps; output in {out}/"
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
        model.logger.close()  # progress.csv (and TensorBoard's events) complete on disk
        for env in extra_envs:
            env.close()
    model_path = out / MODEL_FILE
    model.save(model_path)
    _record_env_in_zip(model_path, settings)
    print(f"Saved the model to {model_path} and the log to {out / 'progress.csv'}")
    _plot(out, f"{settings.algorithm_name} on {settings.env}")
    if settings.eval_episodes > 0:
        eval_env = make_vec_env(env_factory, n_envs=1, seed=settings.seed + 10_000, env_kwargs=settings.env_kwargs)
        with contextlib.closing(eval_env):
            print_evaluation(evaluate_agents(model, eval_env, n_eval_episodes=settings.eval_episodes), "Final evaluation")
            if is_turn_based_vec_env(eval_env):
                print_game_results(model, eval_env, settings.eval_episodes)
    assert model.env is not None
    model.env.close()
    return model_path
