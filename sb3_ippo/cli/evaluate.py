"""``python -m sb3_ippo evaluate MODEL.zip|MODEL.safetensors|RUN_FOLDER``: team and per-agent returns, and a video on
request."""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import pathlib
import sys
import tempfile
import time
import zipfile
from typing import Any

import numpy as np
from stable_baselines3.common.utils import set_random_seed
from stable_baselines3.common.vec_env import VecEnvWrapper

from sb3_ippo.cli.settings import CHECKPOINT_FOLDER, DEFAULT_ENV, DEFAULT_ENV_KWARGS, MODEL_FILE, RUN_FILE
from sb3_ippo.cli.values import env_error, installed
from sb3_ippo.common.env_factory import EnvFactory
from sb3_ippo.common.evaluation import AgentEvaluation, evaluate_agents, evaluate_policy
from sb3_ippo.hyperparams.text import parse_wrapper
from sb3_ippo.games.turn_based import is_turn_based_vec_env
from sb3_ippo.ippo import IPPO
from sb3_ippo.serialization import ModelFileError, check_zip_file
from sb3_ippo.vec_env import make_vec_env


PROGRESS_EVERY = 5.0  # seconds between two progress lines of a long evaluation


class EpisodeProgress(VecEnvWrapper):
    """An evaluation env that prints how many of ``total`` episodes are done, at an episode's end at least ``every``
    seconds (default :data:`PROGRESS_EVERY`) after the start or the last line: an evaluation of long episodes shows it
    is under way, a short one prints nothing."""

    def __init__(self, venv: Any, total: int, every: float | None = None) -> None:
        super().__init__(venv)
        self.total = total
        self.every = PROGRESS_EVERY if every is None else every
        self.episodes = 0
        self.start = self.last_line = time.monotonic()

    def reset(self) -> Any:
        return self.venv.reset()

    def step_wait(self) -> Any:
        obs, rewards, dones, infos = self.venv.step_wait()
        self.episodes += int(np.sum(dones))
        now = time.monotonic()
        if np.any(dones) and now - self.last_line >= self.every and self.episodes < self.total:
            self.last_line = now
            print(f"  {self.episodes}/{self.total} episodes evaluated ({now - self.start:.0f} s)", flush=True)
        return obs, rewards, dones, infos


def print_evaluation(result: AgentEvaluation, heading: str) -> None:
    kind = "deterministic" if result.deterministic else "stochastic (sampled)"
    print(f"{heading}: {result.n_episodes} episodes, {kind} actions")
    mean, std = result.team_mean_std()
    width = max([len("team return"), *(len(str(agent)) for agent in result.agent_returns)])
    print(f"  {'team return':<{width}}  {mean:9.2f} +/- {std:.2f}   (episode length {np.mean(result.lengths):.1f})")
    for agent, (agent_mean, agent_std) in result.agent_mean_std().items():
        print(f"  {agent!s:<{width}}  {agent_mean:9.2f} +/- {agent_std:.2f}")


def print_game_results(model: IPPO, env: Any, n_games: int, heading: str, deterministic: bool = True) -> None:
    """A game's results (a turn-based env, whose team return is 0 whoever wins, so it is not printed): each seat's
    win, draw and loss rates against a uniformly random player, and the win rate over the seats."""
    records = evaluate_policy(model, env, n_eval_episodes=n_games, deterministic=deterministic, opponent="random")
    assert isinstance(records, dict)
    kind = "deterministic" if deterministic else "stochastic (sampled)"
    print(f"{heading}: {n_games} games per seat against a uniformly random player, {kind} actions")
    width = max([len("win rate"), *(len(str(seat)) for seat in records)])
    print(f"  {'win rate':<{width}}  {np.mean([record.win_rate for record in records.values()]):.1%} (mean over the seats)")
    for seat, record in records.items():
        print(f"  {seat!s:<{width}}  {record}")


def _model_path(path: pathlib.Path, parser: argparse.ArgumentParser) -> pathlib.Path:
    if path.is_dir():
        if not (path / MODEL_FILE).is_file():
            parser.error(f"argument model: the folder {path} has no {MODEL_FILE}: give a model .zip or a run folder")
        return path / MODEL_FILE
    if not path.exists() and path.with_suffix(".zip").is_file():
        return path.with_suffix(".zip")
    if not path.is_file():
        parser.error(f"argument model: No model at {path}")
    if path.suffix != ".safetensors":
        try:
            check_zip_file(path)
        except ModelFileError as error:
            parser.error(f"argument model: {error}; a model is a .zip or .safetensors file saved by IPPO")
    return path


def _recorded_run(model_path: pathlib.Path) -> dict[str, Any]:
    """The run the model came from: run.json beside it (or, for a checkpoint ``train --checkpoint-freq`` wrote, in the
    run folder above ``checkpoints/``), else the copy inside its zip, else nothing."""
    folders = [model_path.parent] + ([model_path.parent.parent] if model_path.parent.name == CHECKPOINT_FOLDER else [])
    for folder in folders:
        if (folder / RUN_FILE).is_file():
            return json.loads((folder / RUN_FILE).read_text())
    if zipfile.is_zipfile(model_path):
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
            wrappers = [parse_wrapper(text) for text in run.get("wrappers", [])] if from_run else []
        except ValueError as error:
            parser.error(f"the wrappers recorded in {RUN_FILE} cannot be used: {error}")
    env_factory = EnvFactory(env_id, tuple(wrappers))
    try:
        env_factory.check()
    except ValueError as error:
        parser.error(f"argument --env: {error}")
    heading = f"{env_id} {env_kwargs}" + (f" with wrappers {' '.join(map(str, wrappers))}" if wrappers else "")
    if args.video is not None:
        if not installed("moviepy"):
            parser.error("argument --video: recording needs moviepy: pip install moviepy (or pip install 'sb3_ippo[extra]')")
        env_kwargs = {**env_kwargs, "render_mode": "rgb_array"}
    try:
        env = make_vec_env(env_factory, n_envs=1, seed=args.seed, env_kwargs=env_kwargs)
    except (TypeError, ValueError, AssertionError) as error:
        parser.error(env_error(env_id, env_kwargs, wrappers, error))
    model = _load(model_path, run.get("algo"), env, args.device, parser, f"{env_id} {env_kwargs}")
    set_random_seed(args.seed)  # --stochastic actions and a game's random opponent: the same results run after run
    deterministic = not args.stochastic
    if args.video is None:
        with contextlib.closing(env):
            game = is_turn_based_vec_env(env)
            counted = env if game else EpisodeProgress(env, args.episodes)  # a game's episodes are short
            result = evaluate_agents(model, counted, n_eval_episodes=args.episodes, deterministic=deterministic)
            if game:
                print_game_results(model, env, args.episodes, heading, deterministic)
            else:
                print_evaluation(result, heading)
        return result
    video = video_path(args.video, model_path)
    game = is_turn_based_vec_env(env)
    result = _evaluate_on_video(model, env, video, args.episodes, deterministic)
    if game:
        print(
            f"{heading}: {result.n_episodes} games of the model against itself, "
            f"{'deterministic' if deterministic else 'stochastic (sampled)'} actions"
        )
    else:
        print_evaluation(result, heading)
    print(f"Saved the video of the {result.n_episodes} episodes to {video}")
    return result


def _load(
    model_path: pathlib.Path, algo: str | None, env: Any, device: str, parser: argparse.ArgumentParser, env_text: str
) -> IPPO:
    """The model at ``model_path`` (MAPPO if its run says so) for ``env``; a damaged file, or one that does not fit
    the env, is a usage error (the env closed)."""
    try:
        if algo == "mappo":
            from sb3_ippo.mappo import MAPPO

            # Acting needs only the agents' own observations: the env stays plain, the critic is not used.
            mappo = MAPPO.load(model_path, device=device)
            mappo.check_acting_env(env)
            return mappo
        return IPPO.load(model_path, env=env, device=device)
    except ModelFileError as error:
        env.close()
        parser.error(f"argument model: {error}")
    except ValueError as error:
        env.close()
        parser.error(
            f"{model_path} does not fit the env {env_text}: {error}. Give the env it was trained on with --env, "
            "--env-kwargs and --wrappers."
        )


def video_path(video: pathlib.Path, model_path: pathlib.Path) -> pathlib.Path:
    """Where ``--video`` writes: an absolute path as given; a relative one inside the run folder of the model (the
    folder of the model, or the run folder above its ``checkpoints/``), beside model.zip and run.json, as rl-zoo
    records a run's videos in its log folder, not in the current folder."""
    if video.is_absolute():
        return video
    folder = model_path.parent.parent if model_path.parent.name == CHECKPOINT_FOLDER else model_path.parent
    return folder / video


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
