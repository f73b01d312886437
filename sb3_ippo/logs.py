"""What IPPO writes to SB3's logger: per-update statistics (``train/``) and rollout and time statistics (``rollout/``,
``time/``), for the team, each agent and each group, with keys that fit SB3's 36-character stdout column."""

from __future__ import annotations

import re
import sys
import time
from typing import TYPE_CHECKING

import numpy as np
from stable_baselines3.common.utils import safe_mean

from sb3_ippo.types import AgentID
from sb3_ippo.update.trainer import UpdateJob

if TYPE_CHECKING:
    from sb3_ippo.on_policy_algorithm import MultiAgentOnPolicyAlgorithm

# SB3's stdout logger truncates keys to 36 characters: per-agent keys are built to fit.
MAX_LOG_KEY_LENGTH = 36
_LONGEST_KEY_PARTS = len("rollout/") + len("/ep_rew_mean")


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


def record_update(model: MultiAgentOnPolicyAlgorithm, job: UpdateJob) -> None:
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


def dump_logs(model: MultiAgentOnPolicyAlgorithm, iteration: int = 0) -> None:
    """Write the rollout and time statistics, with the last update's, to the logger (SB3's on-policy layout)."""
    assert model.ep_info_buffer is not None
    time_elapsed = max((time.time_ns() - model.start_time) / 1e9, sys.float_info.epsilon)
    fps = int((model.num_timesteps - model._num_timesteps_at_start) / time_elapsed)
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
