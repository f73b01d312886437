"""What IPPO writes to SB3's logger: per-update statistics (``train/``) and rollout and time statistics (``rollout/``,
``time/``), for the team, each agent and each group, with keys that fit SB3's 36-character stdout column; and how
often SB3's stdout table is printed, since IPPO's updates come far more often than SB3's rollouts."""

from __future__ import annotations

import re
import sys
import time
from typing import TYPE_CHECKING, Any

import numpy as np
from stable_baselines3.common.logger import HumanOutputFormat, Logger
from stable_baselines3.common.utils import safe_mean

from sb3_ippo.common.type_aliases import AgentID
from sb3_ippo.update.trainer import UpdateJob
from sb3_ippo.games.turn_based import is_turn_based_vec_env

if TYPE_CHECKING:
    from sb3_ippo.common.base_class import MultiAgentBaseAlgorithm

# SB3's stdout logger truncates keys to 36 characters: per-agent keys are built to fit.
MAX_LOG_KEY_LENGTH = 36
_LONGEST_KEY_PARTS = len("rollout/") + len("/ep_rew_mean")
# At verbose=1, SB3's stdout table comes about this many times in one learn (and first after the first update), and
# never more often than every MIN_PRINT_EVERY env steps: an update every 200 env steps (simple_spread's defaults)
# would otherwise print 1,000 tables of 30 lines in a 200,000-step run. progress.csv and TensorBoard get every dump.
TABLES_PER_LEARN = 10
MIN_PRINT_EVERY = 10_000


def print_every(timesteps: int) -> int:
    """At ``verbose=1``, the env steps between two stdout tables of a ``learn`` of ``timesteps`` env steps."""
    return max(MIN_PRINT_EVERY, timesteps // TABLES_PER_LEARN)


def is_due(every: int, last_step: int | None, step: int) -> bool:
    """Whether a dump at ``step`` is printed: the first one, then the first at or after each multiple of ``every``
    env steps (``every`` 0: all of them), so the tables come at a steady interval whatever the update size."""
    return last_step is None or every == 0 or step // every > last_step // every


class ThrottledHumanOutputFormat(HumanOutputFormat):
    """SB3's stdout table, printed only when :func:`is_due`. Writes to the ``sys.stdout`` of the moment, so that the
    rich progress bar (which redirects stdout while it is shown) keeps the table above the bar."""

    def __init__(self, every: int) -> None:
        super().__init__(sys.stdout)
        self.every = every
        self.last_step: int | None = None

    def write(self, key_values: dict[str, Any], key_excluded: dict[str, tuple[str, ...]], step: int = 0) -> None:
        if not is_due(self.every, self.last_step, step):
            return
        self.last_step = step
        self.file = sys.stdout  # type: ignore[assignment]  # SB3 annotates it TextIOWrapper; any text file works
        super().write(key_values, key_excluded, step)

    def write_sequence(self, sequence: list[Any]) -> None:
        self.file = sys.stdout  # type: ignore[assignment]  # SB3 annotates it TextIOWrapper; any text file works
        super().write_sequence(sequence)


def throttle_stdout(logger: Logger, every: int) -> None:
    """Print ``logger``'s stdout table (SB3's, as ``verbose=1`` configures it) only every ``every`` env steps."""
    logger.output_formats = [
        ThrottledHumanOutputFormat(every)
        if type(output) is HumanOutputFormat and output.file is sys.stdout  # type: ignore[comparison-overlap]
        else output
        for output in logger.output_formats
    ]


def log_names(agent_ids: list[AgentID]) -> dict[AgentID, str]:
    """Agent names for per-agent logger keys: short enough that every key stays within 36 characters, unique."""
    width = MAX_LOG_KEY_LENGTH - _LONGEST_KEY_PARTS
    names = {agent: re.sub(r"[^\w.-]", "_", str(agent))[:width] for agent in agent_ids}
    if len(set(names.values())) < len(names):
        names = {agent: f"agent{index}" for index, agent in enumerate(agent_ids)}
    return names


def per_agent_exclude(verbose: int) -> tuple[str, ...] | None:
    """Per-agent keys go to CSV and TensorBoard, but to stdout only at ``verbose=2``: with many agents they would bury
    the team's numbers."""
    return None if verbose >= 2 else ("stdout", "log")


def record_update(model: MultiAgentBaseAlgorithm, job: UpdateJob) -> None:
    """Record the last update's statistics (``model.update_stats``): the team's means, each agent's, each group's,
    and the model's counters."""
    exclude = per_agent_exclude(model.verbose)
    # A policy shared by several agents counts once.
    stats = list({id(agent_stats): agent_stats for agent_stats in model.update_stats.values()}.values())
    if stats:
        for name in (
            "policy_loss",
            "policy_loss_delta",
            "value_loss",
            "value_loss_delta",
            "approx_kl",
            "entropy_loss",
            "clip_fraction",
            "explained_variance",
            "n_epochs_run",
        ):
            model.logger.record(f"train/{name}", float(np.mean([getattr(s, name) for s in stats])))
    for agent, agent_stats in model.update_stats.items():
        prefix = f"train/{model._log_names[agent]}/"
        for name in ("policy_loss", "value_loss", "approx_kl", "entropy_loss", "clip_fraction", "n_epochs_run"):
            model.logger.record(prefix + name, getattr(agent_stats, name), exclude=exclude)
        model.logger.record(prefix + "n_transitions", agent_stats.n_transitions, exclude=exclude)
    for name, group in model._agent_groups.items():
        group_stats = [model.update_stats[agent] for agent in group.agents if agent in model.update_stats]
        if len(group.agents) > 1 and group_stats:
            prefix = f"train/{model._group_log_names[name]}/"
            for key in ("policy_loss", "value_loss", "approx_kl", "n_epochs_run"):
                model.logger.record(prefix + key, float(np.mean([getattr(s, key) for s in group_stats])))
        if "learning_rate" in group.settings:
            learning_rate = job.settings[name].learning_rate
            model.logger.record(f"train/{model._group_log_names[name]}/learning_rate", learning_rate)
    model.logger.record("train/policy_version", model.policy_version)
    model.logger.record("train/n_updates", model._n_updates, exclude="tensorboard")
    model.logger.record("train/learning_rate", model.lr_schedule(job.progress_remaining))
    model.logger.record("train/clip_range", model.clip_range_schedule(job.progress_remaining))
    model.logger.record("rollout/stale_episodes_dropped", model.stale_episodes_dropped)
    model.logger.record("rollout/env_restarts", model.env_restarts)
    model.logger.record("rollout/episodes_lost", model.episodes_lost)
    if model.max_buffered_episodes is not None:
        model.logger.record("rollout/rejected_episodes", model.rejected_episodes)


def steps_and_seconds(model: MultiAgentBaseAlgorithm) -> tuple[int, float]:
    """The env steps and wall-clock seconds of the current ``learn`` so far."""
    return model.num_timesteps - model._num_timesteps_at_start, max(
        (time.time_ns() - model.start_time) / 1e9, sys.float_info.epsilon
    )


def dump_logs(model: MultiAgentBaseAlgorithm, iteration: int = 0) -> None:
    """Write the rollout and time statistics, with the last update's, to the logger (SB3's on-policy layout)."""
    assert model.ep_info_buffer is not None
    steps, time_elapsed = steps_and_seconds(model)
    fps = int(steps / time_elapsed)
    if iteration > 0:
        model.logger.record("time/iterations", iteration, exclude="tensorboard")
    if len(model.ep_info_buffer) > 0:
        model.logger.record("rollout/ep_rew_mean", safe_mean([info["r"] for info in model.ep_info_buffer]))
        model.logger.record("rollout/ep_len_mean", safe_mean([info["l"] for info in model.ep_info_buffer]))
        for agent in model.possible_agents:
            returns = [
                info["agent_returns"][agent] for info in model.ep_info_buffer if agent in info.get("agent_returns", {})
            ]
            if returns:
                key = f"rollout/{model._log_names[agent]}/ep_rew_mean"
                model.logger.record(key, safe_mean(returns), exclude=per_agent_exclude(model.verbose))
    model.logger.record("time/fps", fps)
    model.logger.record("time/time_elapsed", int(time_elapsed), exclude="tensorboard")
    model.logger.record("time/total_timesteps", model.num_timesteps, exclude="tensorboard")
    model.logger.dump(step=model.num_timesteps)


def learned_summary(model: MultiAgentBaseAlgorithm) -> str:
    """One line on what a ``learn`` achieved: env steps, time, speed, updates and the latest team return."""
    assert model.ep_info_buffer is not None
    steps, seconds = steps_and_seconds(model)
    minutes, rest = divmod(round(seconds), 60)
    parts = [
        f"{type(model).__name__} learned {steps:,} env steps in {minutes}:{rest:02d} ({int(steps / seconds):,} env steps/s)",
        f"{model._n_updates:,} updates in all (policy_version {model.policy_version})",
    ]
    # A game's team return is 0 whoever wins (evaluate_policy(..., opponent=...) scores games): not shown.
    game = model.env is not None and is_turn_based_vec_env(model.env)
    if not game and len(model.ep_info_buffer) > 0:
        team_return = safe_mean([info["r"] for info in model.ep_info_buffer])
        parts.append(f"team return {team_return:.2f} (mean of the last {len(model.ep_info_buffer)} episodes)")
    elif not game:
        parts.append("no episode finished")
    return "; ".join(parts)
