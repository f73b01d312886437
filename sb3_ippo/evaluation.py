"""Evaluation of an IPPO model by its team return, as SB3's ``evaluate_policy`` and ``EvalCallback`` do it.

``MultiAgentVecEnv`` follows SB3's ``VecEnv`` step contract (per-copy team rewards, dones and infos, with
Monitor-style episode statistics), so SB3's own evaluation loop runs on it unchanged; these wrappers only turn a
PettingZoo env into that vectorized env first. SB3's ``VecEnvWrapper``s around it (``VecVideoRecorder``) are kept.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from stable_baselines3.common import evaluation
from stable_baselines3.common.callbacks import BaseCallback, EvalCallback
from stable_baselines3.common.vec_env import VecEnv, VecEnvWrapper

from sb3_ippo.vec_env import AgentID, MultiAgentVecEnv, as_multiagent_vec_env


def as_evaluation_env(env: Any) -> VecEnv:
    """``env`` as the vectorized env SB3's evaluation loop steps: a PettingZoo env becomes a one-copy
    ``MultiAgentVecEnv``; ``make_vec_env(...)`` output, bare or inside SB3 ``VecEnvWrapper``s, is used as it is."""
    if isinstance(env, VecEnvWrapper) and isinstance(env.unwrapped, MultiAgentVecEnv):
        return env
    return as_multiagent_vec_env(env)


def evaluate_policy(
    model: Any,
    env: Any,
    n_eval_episodes: int = 10,
    deterministic: bool = True,
    render: bool = False,
    callback: Callable[[dict[str, Any], dict[str, Any]], None] | None = None,
    reward_threshold: float | None = None,
    return_episode_rewards: bool = False,
    warn: bool = True,
) -> tuple[float, float] | tuple[list[float], list[int]]:
    """Run ``n_eval_episodes`` episodes and score each by its team return (the sum of all agents' rewards).

    :param model: An IPPO model (anything whose ``predict`` maps ``{agent_id: obs}`` to ``{agent_id: action}``).
    :param env: A PettingZoo ``ParallelEnv``, a parallelizable ``AECEnv``, or ``make_vec_env(...)`` (also inside SB3
        ``VecEnvWrapper``s such as ``VecVideoRecorder``). With several copies, episodes are spread evenly over them,
        as SB3 does, so that short episodes are not favoured.
    :param deterministic: Use deterministic actions.
    :param render: Render the env at each step.
    :param callback: Called after each step with the evaluation loop's ``locals()`` and ``globals()``.
    :param reward_threshold: If set, assert that the mean team return reaches it.
    :param return_episode_rewards: Return the per-episode team returns and lengths instead of mean and std.
    :return: ``(mean, std)`` of the team return, or ``(team returns, lengths)`` per episode.
    """
    return evaluation.evaluate_policy(
        model,
        as_evaluation_env(env),
        n_eval_episodes=n_eval_episodes,
        deterministic=deterministic,
        render=render,
        callback=callback,
        reward_threshold=reward_threshold,
        return_episode_rewards=return_episode_rewards,
        warn=warn,
    )


class MultiAgentEvalCallback(EvalCallback):
    """SB3's ``EvalCallback`` for IPPO: every ``eval_freq`` calls it evaluates the model on ``eval_env`` and scores
    it by the mean team return (``eval/mean_reward``), saves the best model, and triggers ``callback_on_new_best``
    (e.g. ``StopTrainingOnRewardThreshold``). Largely identical to its parent: only the env handling differs.

    :param eval_env: A PettingZoo ``ParallelEnv``, a parallelizable ``AECEnv`` or ``make_vec_env(...)``.
    """

    def __init__(
        self,
        eval_env: Any,
        callback_on_new_best: BaseCallback | None = None,
        callback_after_eval: BaseCallback | None = None,
        n_eval_episodes: int = 5,
        eval_freq: int = 10000,
        log_path: str | None = None,
        best_model_save_path: str | None = None,
        deterministic: bool = True,
        render: bool = False,
        verbose: int = 1,
        warn: bool = True,
    ) -> None:
        super().__init__(
            as_evaluation_env(eval_env),
            callback_on_new_best=callback_on_new_best,
            callback_after_eval=callback_after_eval,
            n_eval_episodes=n_eval_episodes,
            eval_freq=eval_freq,
            log_path=log_path,
            best_model_save_path=best_model_save_path,
            deterministic=deterministic,
            render=render,
            verbose=verbose,
            warn=warn,
        )


@dataclass
class AgentEvaluation:
    """What :func:`evaluate_agents` measured: per episode, the team return, the length and every agent's return."""

    team_returns: list[float]
    lengths: list[int]
    agent_returns: dict[AgentID, list[float]] = field(default_factory=dict)
    deterministic: bool = True

    @property
    def n_episodes(self) -> int:
        return len(self.team_returns)

    def team_mean_std(self) -> tuple[float, float]:
        return float(np.mean(self.team_returns)), float(np.std(self.team_returns))

    def agent_mean_std(self) -> dict[AgentID, tuple[float, float]]:
        return {agent: (float(np.mean(returns)), float(np.std(returns))) for agent, returns in self.agent_returns.items()}


def evaluate_agents(model: Any, env: Any, n_eval_episodes: int = 10, deterministic: bool = True) -> AgentEvaluation:
    """Like :func:`evaluate_policy`, but keeping each agent's return as well as the team's: for competitive envs,
    where the team return (the sum) says little.

    :param env: As for :func:`evaluate_policy`.
    :return: the team returns, lengths and per-agent returns of the ``n_eval_episodes`` episodes (an agent that
        did not take part in an episode has no entry for it).
    """
    agent_returns: dict[AgentID, list[float]] = {}

    def record_agent_returns(local_vars: dict[str, Any], _globals: dict[str, Any]) -> None:
        info = local_vars["info"]
        if local_vars["done"] and "episode" in info:
            for agent, episode_return in info["episode"].get("agent_returns", {}).items():
                agent_returns.setdefault(agent, []).append(float(episode_return))

    team_returns, lengths = evaluation.evaluate_policy(
        model,
        as_evaluation_env(env),
        n_eval_episodes=n_eval_episodes,
        deterministic=deterministic,
        callback=record_agent_returns,
        return_episode_rewards=True,
        warn=False,
    )
    return AgentEvaluation(
        team_returns=[float(r) for r in team_returns],  # type: ignore[union-attr]
        lengths=[int(n) for n in lengths],  # type: ignore[union-attr]
        agent_returns=agent_returns,
        deterministic=deterministic,
    )
