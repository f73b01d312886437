"""``python -m sb3_ippo train``: build the env and the model from the settings, train with the SB3 logger (a summary
line or the table on stdout at a steady interval, a CSV row per update, TensorBoard: ``sb3_ippo.cli.output``), save
the model, run.json and the learning curve, then evaluate."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib
import json
import pathlib
import shlex
import zipfile
from typing import Any

import numpy as np

from sb3_ippo.cli.evaluate import EpisodeProgress, print_evaluation, print_game_results
from sb3_ippo.cli.interrupt import RunInterrupted, ctrl_c_deferred, written_whole
from sb3_ippo.cli.output import make_logger
from sb3_ippo.cli.settings import (
    ALGORITHMS,
    CHECKPOINT_FOLDER,
    MODEL_FILE,
    RUN_FILE,
    TrainSettings,
    claim_run_folder,
    default_run_folder,
    resolve_train_settings,
)
from sb3_ippo.cli.values import env_error, installed
from sb3_ippo.common.env_factory import EnvFactory
from sb3_ippo.common.evaluation import evaluate_agents
from sb3_ippo.hyperparams.validation import check_hyperparameters
from sb3_ippo.hyperparams.text import schedule
from sb3_ippo.ippo import IPPO
from sb3_ippo.games.turn_based import is_turn_based_vec_env
from sb3_ippo.vec_env import make_vec_env


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
    elif h["n_episodes"] is not None:
        how = f"n_episodes={h['n_episodes']} trajectories, in episodes of about {length} steps with random actions"
        first = -(-h["n_episodes"] // settings.n_envs) * per_round
        per_update = h["n_episodes"] * length
    else:
        # SB3's cadence: an update every rollout_len steps of each copy, whatever the episodes' length; with
        # align_rollouts, episodes that fit in a rollout (the copies finishing together) end it at the last of them.
        rollout = h["rollout_len"]
        if h["align_rollouts"] and length <= rollout:
            rollout = length * (rollout // length)
        how = f"rollouts of {rollout} steps of each of the {settings.n_envs} env copies (rollout_len={h['rollout_len']})"
        first = per_update = rollout * settings.n_envs
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

    from sb3_ippo.common.evaluation import MultiAgentEvalCallback

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
    assert settings.eval_freq is not None and settings.n_eval_episodes is not None  # with_game_defaults
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
                verbose=int(settings.verbose >= 2),  # its lines at verbose 1 would double the summary line's
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


def _make_env(settings: TrainSettings, env_factory: EnvFactory, parser: argparse.ArgumentParser) -> Any:
    try:
        return make_vec_env(
            env_factory,
            n_envs=settings.n_envs,
            seed=settings.seed,
            vec_env_cls=settings.vec_env,
            env_kwargs=settings.env_kwargs,
            critic_input=settings.critic_input,
        )
    except (TypeError, ValueError, AssertionError) as error:
        parser.error(env_error(settings.env, settings.env_kwargs, settings.wrappers, error))


def _build(settings: TrainSettings, env_factory: EnvFactory, parser: argparse.ArgumentParser) -> IPPO:
    env = _make_env(settings, env_factory, parser)
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


def _load_to_resume(settings: TrainSettings, env_factory: EnvFactory, parser: argparse.ArgumentParser) -> IPPO:
    """``--resume``: the run's model.zip on a new env of its settings, refused if it has trained its budget."""
    model_path = pathlib.Path(settings.out) / MODEL_FILE
    env = _make_env(settings, env_factory, parser)
    try:
        model = algorithm_class(settings.algo).load(model_path, env=env, device=settings.device)
    except ValueError as error:  # a damaged file (ModelFileError) or an env that does not fit it
        env.close()
        parser.error(f"argument --resume: {error}")
    if model.num_timesteps >= settings.timesteps:
        env.close()
        parser.error(
            f"argument --resume: {settings.out} has trained its budget ({model.num_timesteps} env steps of "
            f"--timesteps {settings.timesteps}): give a larger --timesteps to train it further"
        )
    return model


def _record_env_in_zip(model_path: pathlib.Path, settings: TrainSettings) -> None:
    """Add run.json to the model's zip (SB3's loader ignores it), so that ``evaluate`` of the zip alone finds its env."""
    with zipfile.ZipFile(model_path, "a") as archive:
        archive.writestr(RUN_FILE, json.dumps(settings.to_json(), indent=2))


def _remove_earlier_run(out: pathlib.Path) -> None:
    """``--overwrite``: delete what an earlier run wrote only with some options (its checkpoints, evaluations and best
    model), which this run might not write again and which would then pass for this run's; the rest it writes anew.
    Only those files: anything else in the folder stays."""
    stale = [*(out / CHECKPOINT_FOLDER).glob("model_*_steps.zip"), out / "eval" / "evaluations.npz", out / "best_model.zip"]
    for path in stale:
        path.unlink(missing_ok=True)


def _save_model(model: IPPO, settings: TrainSettings) -> pathlib.Path:
    """model.zip, with run.json inside, written whole (see ``written_whole``)."""
    model_path = pathlib.Path(settings.out) / MODEL_FILE
    with written_whole(model_path) as partial:
        model.save(partial)
        _record_env_in_zip(partial, settings)
    return model_path


def _plot(out: pathlib.Path, title: str, game: bool) -> pathlib.Path | None:
    """Write the learning curve (whole) and return its path; None, saying why, if there is none."""
    from sb3_ippo.common.plotting import plot_learning_curve

    png = out / "learning_curve.png"
    try:
        with written_whole(png) as partial:
            written = plot_learning_curve(out / "progress.csv", partial, title, game=game)
    except ImportError:
        print(
            "No learning curve: matplotlib is not installed (pip install matplotlib, or pip install 'sb3_ippo[extra]'); "
            f"the data is in {out / 'progress.csv'}"
        )
        return None
    if not written:
        what = "win rate (--eval-freq 0?)" if game else "episode return (no log row was written: see above)"
        print(f"No learning curve: {out / 'progress.csv'} has no {what}")
        return None
    return png


def _check_options(settings: TrainSettings, args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    """What the options ask for is installed, --out is free (unless --overwrite or --resume), and the
    hyperparameters go together: usage errors before anything is built."""
    if settings.tensorboard_log is not None and not installed("tensorboard"):
        parser.error("argument --tensorboard-log: TensorBoard is not installed: pip install tensorboard")
    if settings.wandb_project is not None and not (installed("wandb") and installed("tensorboard")):
        parser.error(
            "argument --wandb-project: Weights & Biases tracking needs wandb and tensorboard: pip install wandb "
            "tensorboard (or pip install 'sb3_ippo[wandb]')"
        )
    out = pathlib.Path(settings.out)
    if out.exists() and not out.is_dir():
        parser.error(f"argument --out: {out} is a file, not a folder")
    if (out / MODEL_FILE).exists() and not args.overwrite and args.resume is None:
        parser.error(
            f"argument --out: {out} already holds {MODEL_FILE} from an earlier run: give another --out (without --out, "
            f"each run gets a new numbered folder under runs/), --resume {out} to continue it, or --overwrite to "
            "replace its files"
        )
    try:
        # The combinations (each value was checked when parsed), before anything is built.
        check_hyperparameters({name: schedule(value) for name, value in settings.hyperparameters.items()})
    except ValueError as error:
        parser.error(str(error))


def _learn(model: IPPO, settings: TrainSettings, callbacks: list[Any], progress_bar: bool, resume: bool) -> bool:
    """Train up to the budget (``settings.timesteps`` env steps in all, for a resumed run too); True if Ctrl-C
    stopped it. The progress bar is closed either way (SB3 closes it only at the end of a complete ``learn``)."""
    from stable_baselines3.common.callbacks import ProgressBarCallback

    bar = ProgressBarCallback() if progress_bar else None
    try:
        model.learn(
            settings.timesteps - model.num_timesteps if resume else settings.timesteps,
            callback=[*callbacks, *([bar] if bar else [])] or None,
            log_interval=settings.log_interval,
            reset_num_timesteps=not resume,
        )
    except KeyboardInterrupt:
        if bar is not None and hasattr(bar, "pbar"):
            bar.pbar.close()
        return True
    return False


def train(args: argparse.Namespace, parser: argparse.ArgumentParser) -> pathlib.Path:
    """Run ``train`` (or ``train --resume``) and return the path of the saved model.

    :raises RunInterrupted: after Ctrl-C, once the run is saved, with the one line to print.
    """
    import torch as th

    resume = args.resume is not None
    if resume:
        args = resumed_args(args, parser)
    settings = resolve_train_settings(args, parser)
    env_factory = EnvFactory(settings.env, tuple(settings.wrappers))
    try:
        env_factory.check()
    except ValueError as error:
        parser.error(f"argument --env: {error}")
    _check_options(settings, args, parser)
    th.set_num_threads(settings.threads)
    _check_log_interval(env_factory, settings, parser)
    model = _load_to_resume(settings, env_factory, parser) if resume else _build(settings, env_factory, parser)
    game = is_turn_based_vec_env(model.env)
    settings = settings.with_game_defaults(game)
    out = pathlib.Path(settings.out)
    if args.out is None:
        # The numbered folder chosen above may have been taken since by a run started at the same time.
        out = claim_run_folder(default_run_folder(settings.algo, settings.env))
        settings = dataclasses.replace(settings, out=str(out))
    else:
        out.mkdir(parents=True, exist_ok=True)
        if args.overwrite:
            _remove_earlier_run(out)
    if settings.wandb_project is not None and settings.tensorboard_log is None:
        # wandb reads the metrics from the TensorBoard events (sync_tensorboard), as in its SB3 integration.
        settings = dataclasses.replace(settings, tensorboard_log=str(out / "tensorboard"))
    wandb_run = _start_wandb(settings) if settings.wandb_project is not None else None
    # after wandb.init, which patches TensorBoard's writer; a resumed run appends to its progress.csv
    model.set_logger(make_logger(settings, game, append=resume))
    (out / RUN_FILE).write_text(json.dumps(settings.to_json(), indent=2) + "\n")
    wrappers = f" with wrappers {' '.join(map(str, settings.wrappers))}" if settings.wrappers else ""
    what = f"{settings.algorithm_name} on {settings.env} {settings.env_kwargs}{wrappers}"
    if resume:
        print(f"Resuming {what} at {model.num_timesteps} of {settings.timesteps} env steps; output in {out}/")
    else:
        print(f"Training {what} for {settings.timesteps} env steps; output in {out}/")
    callbacks, extra_envs = _callbacks(settings, env_factory)
    if wandb_run is not None:
        from sb3_ippo.tracking import WandbCallback

        callbacks.append(WandbCallback())  # the model's hyperparameters into the run's config
    try:
        interrupted = _learn(model, settings, callbacks, not args.no_progress_bar and _progress_bar_available(), resume)
    finally:
        with ctrl_c_deferred(f"the run into {out}/"):
            model.logger.close()  # progress.csv (and TensorBoard's events) complete on disk
            for env in extra_envs:
                env.close()
    try:
        with ctrl_c_deferred(f"the run into {out}/"):
            model_path = _save_model(model, settings)
            curve = _plot(out, f"{settings.algorithm_name} on {settings.env}", game)
    except KeyboardInterrupt:
        raise RunInterrupted(
            f"Stopped while saving the run into {out}/: each file there is whole, {MODEL_FILE} and the learning "
            "curve possibly missing or from before"
        ) from None
    curve_text = "" if curve is None else f", the learning curve to {curve}"
    if interrupted:
        assert model.env is not None
        model.env.close()
        if wandb_run is not None:
            _finish_wandb(wandb_run, out)
        raise RunInterrupted(
            f"Interrupted at {model.num_timesteps} of {settings.timesteps} env steps: saved the model to {model_path}"
            f"{curve_text} and the log to {out / 'progress.csv'}; continue with: python -m sb3_ippo train --resume "
            f"{shlex.quote(str(out))}"
        )
    print(f"Saved the model to {model_path}{curve_text} and the log to {out / 'progress.csv'}")
    _final_evaluation(model, settings, env_factory, game)
    assert model.env is not None
    model.env.close()
    if wandb_run is not None:
        _finish_wandb(wandb_run, out)
    return model_path


def _final_evaluation(model: IPPO, settings: TrainSettings, env_factory: EnvFactory, game: bool) -> None:
    """``--eval-episodes`` episodes (a game: games per seat against a random player), with a progress line every
    few seconds; Ctrl-C stops it, the run being saved already."""
    if settings.eval_episodes == 0:
        return
    eval_env = make_vec_env(env_factory, n_envs=1, seed=settings.seed + 10_000, env_kwargs=settings.env_kwargs)
    try:
        with contextlib.closing(eval_env):
            if game:
                print_game_results(model, eval_env, settings.eval_episodes, heading="Final evaluation")
            else:
                progress = EpisodeProgress(eval_env, settings.eval_episodes)
                result = evaluate_agents(model, progress, n_eval_episodes=settings.eval_episodes)
                print_evaluation(result, "Final evaluation")
    except KeyboardInterrupt:
        raise RunInterrupted(
            f"Interrupted during the final evaluation; the run is saved in {settings.out}/ "
            f"(python -m sb3_ippo evaluate {shlex.quote(settings.out)} evaluates it)"
        ) from None


def resumed_args(args: argparse.Namespace, parser: argparse.ArgumentParser) -> argparse.Namespace:
    """``--resume RUN_FOLDER``: the command line recorded in the folder's run.json, with ``--out`` that folder and the
    ``--timesteps`` (a new budget) and ``--no-progress-bar`` given beside ``--resume``."""
    folder: pathlib.Path = args.resume
    if not (folder / RUN_FILE).is_file():
        parser.error(f"argument --resume: {folder} has no {RUN_FILE}: give the --out folder of a run of `train`")
    if not (folder / MODEL_FILE).is_file():
        parser.error(
            f"argument --resume: {folder} has no {MODEL_FILE} to continue from (the run stopped before saving one): "
            f"start it again with the command in {folder / RUN_FILE}"
        )
    try:
        recorded = json.loads((folder / RUN_FILE).read_text())["argv"]
    except (ValueError, KeyError, TypeError) as error:
        parser.error(f"argument --resume: {folder / RUN_FILE} is damaged ({type(error).__name__}: {error})")
    argv = [*recorded[1:], "--out", str(folder)]  # recorded[0] is "train"
    if args.timesteps is not None:
        argv += ["--timesteps", str(args.timesteps)]
    if args.no_progress_bar:
        argv.append("--no-progress-bar")
    resumed = parser.parse_args(argv)
    resumed.command, resumed.resume = "train", folder
    return resumed


def _start_wandb(settings: TrainSettings) -> Any:
    """A Weights & Biases run in ``--wandb-project``, named after the run folder, with run.json as its config; it
    syncs the TensorBoard events, so it gets every logger key (WANDB_MODE=offline keeps it on disk)."""
    import wandb

    out = pathlib.Path(settings.out)
    return wandb.init(
        project=settings.wandb_project,
        name=out.name,
        dir=str(out),
        config=settings.to_json(),
        sync_tensorboard=True,
        job_type="train",
    )


def _finish_wandb(run: Any, out: pathlib.Path) -> None:
    """Upload the run's files (the model, run.json, progress.csv, the learning curve) and close the run."""
    for name in (MODEL_FILE, RUN_FILE, "progress.csv", "learning_curve.png"):
        if (out / name).is_file():
            run.save(str(out / name), base_path=str(out), policy="now")
    run.finish()
    import wandb

    # sync_tensorboard patched TensorBoard's writer for this run's folder: a later run in this process patches anew.
    wandb.tensorboard.unpatch()  # type: ignore[attr-defined]
    print(f"Logged to Weights & Biases: project {run.project}, run {run.name} ({out / 'wandb'})")
