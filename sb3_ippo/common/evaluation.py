"""Evaluation of an IPPO model by its team return, as SB3's ``evaluate_policy`` and ``EvalCallback`` do it.

``MultiAgentVecEnv`` follows SB3's ``VecEnv`` step contract (per-copy team rewards, dones and infos, with
Monitor-style episode statistics), so SB3's own evaluation loop runs on it unchanged; these wrappers only turn a
PettingZoo env into that vectorized env first. SB3's ``VecEnvWrapper``s around it (``VecVideoRecorder``) are kept.
A model with recurrent agents acts in that loop as in collection (:class:`sb3_ippo.common.acting.CarryingModel`): each
agent's state from its own first step in a copy, zeroed at the copy's episode end.
With an ``opponent``, games are scored instead by the win, draw and loss rates of each seat (:mod:`sb3_ippo.games.evaluation`).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from stable_baselines3.common import evaluation
from stable_baselines3.common.callbacks import BaseCallback, EvalCallback
from stable_baselines3.common.vec_env import VecEnv, VecEnvWrapper

from sb3_ippo.common.acting import acting_model
from sb3_ippo.games.evaluation import SeatRecord, evaluate_game
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
    opponent: Any = None,
) -> tuple[float, float] | tuple[list[float], list[int]] | dict[AgentID, SeatRecord]:
    """Run ``n_eval_episodes`` episodes and score each by its team return (the sum of all agents' rewards); with an
    ``opponent``, play games instead and return each seat's win, draw and loss rates.

    :param model: An IPPO model (anything whose ``predict`` maps ``{agent_id: obs}`` to ``{agent_id: action}``). Its
        recurrent agents act as in collection: each agent's state carried in each env copy from its own first step
        (zeros for an agent that joins mid-episode), reset at the end of the copy's episode.
    :param env: A PettingZoo ``ParallelEnv``, a parallelizable ``AECEnv``, or ``make_vec_env(...)`` (also inside SB3
        ``VecEnvWrapper``s such as ``VecVideoRecorder``). With several copies, episodes are spread evenly over them,
        as SB3 does, so that short episodes are not favoured.
    :param deterministic: Use deterministic actions.
    :param render: Render the env at each step.
    :param callback: Called after each step with the evaluation loop's ``locals()`` and ``globals()``.
    :param reward_threshold: If set, assert that the mean team return reaches it.
    :param return_episode_rewards: Return the per-episode team returns and lengths instead of mean and std.
    :param opponent: For games: ``"random"`` (uniform among legal moves), a model or policy with ``predict``, or a
        function of the batched observations. Each seat is then played by the model for ``n_eval_episodes`` games,
        the other seats by the opponent (see :func:`sb3_ippo.games.evaluation.evaluate_game`).
    :return: ``(mean, std)`` of the team return, or ``(team returns, lengths)`` per episode; with an ``opponent``,
        ``{seat: SeatRecord}`` (``win_rate``, ``draw_rate``, ``loss_rate``, ``non_loss_rate``, ``n_games``).
    """
    if opponent is not None:
        if return_episode_rewards or reward_threshold is not None or render or callback is not None:
            raise ValueError(
                "With an opponent, evaluate_policy returns win, draw and loss rates per seat: return_episode_rewards, "
                "reward_threshold, render and callback are for team returns (opponent=None)"
            )
        return evaluate_game(model, env, opponent, n_eval_episodes=n_eval_episodes, deterministic=deterministic)
    vec_env = as_evaluation_env(env)
    return evaluation.evaluate_policy(
        acting_model(model, vec_env),
        vec_env,
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
    (e.g. ``StopTrainingOnRewardThreshold``). Largely identical to its parent: only the env handling differs, and a model
    with recurrent agents acts as in collection (each agent's state from its own first step in each copy).

    With an ``opponent`` (games), the model plays each seat against it for ``n_eval_episodes`` games, and the score
    is the win rate averaged over the seats (``eval/win_rate``; also ``eval/draw_rate``, ``eval/loss_rate`` and
    ``eval/<seat>/win_rate``): the best model is the one that wins most, and ``StopTrainingOnRewardThreshold(0.9)``
    stops at a 90% win rate. ``log_path`` then holds ``timesteps``, ``win_rates``, ``draw_rates`` and ``loss_rates``
    (one row per evaluation, one column per seat).

    :param eval_env: A PettingZoo env (parallel or AEC) or ``make_vec_env(...)``.
    :param eval_freq: Evaluate every this many calls of the callback, as in SB3: one call per vectorized ``env.step``,
        which steps each of the training env's ``n_envs`` copies once, so ``eval_freq * n_envs`` env steps
        (``model.num_timesteps``). To evaluate every N env steps, pass ``max(N // n_envs, 1)`` (what the command
        line's ``--eval-freq N`` does).
    :param opponent: None (score by team return), ``"random"``, a model or policy with ``predict``, or a function.
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
        opponent: Any = None,
    ) -> None:
        self.opponent = opponent
        self.evaluations_win_rates: list[list[float]] = []
        self.evaluations_draw_rates: list[list[float]] = []
        self.evaluations_loss_rates: list[list[float]] = []
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

    def _on_step(self) -> bool:
        if self.eval_freq <= 0 or self.n_calls % self.eval_freq != 0:
            return True
        if self.opponent is None:
            # SB3's evaluation, with a model that acts as collection does (sb3_ippo.common.acting); it saves, logs and calls
            # back with the model itself, whose attributes the acting model reads through.
            model, self.model = self.model, acting_model(self.model, self.eval_env)
            try:
                return super()._on_step()
            finally:
                self.model = model
        records = evaluate_game(
            self.model, self.eval_env, self.opponent, n_eval_episodes=self.n_eval_episodes, deterministic=self.deterministic
        )
        win_rate = float(np.mean([record.win_rate for record in records.values()]))
        draw_rate = float(np.mean([record.draw_rate for record in records.values()]))
        loss_rate = float(np.mean([record.loss_rate for record in records.values()]))
        if self.log_path is not None:
            self.evaluations_timesteps.append(self.num_timesteps)
            self.evaluations_win_rates.append([record.win_rate for record in records.values()])
            self.evaluations_draw_rates.append([record.draw_rate for record in records.values()])
            self.evaluations_loss_rates.append([record.loss_rate for record in records.values()])
            np.savez(
                self.log_path,
                timesteps=self.evaluations_timesteps,
                seats=list(records),
                win_rates=self.evaluations_win_rates,
                draw_rates=self.evaluations_draw_rates,
                loss_rates=self.evaluations_loss_rates,
            )
        self.last_mean_reward = win_rate
        if self.verbose >= 1:
            results = "; ".join(f"{seat} {record}" for seat, record in records.items())
            print(f"Eval num_timesteps={self.num_timesteps}: {results}")
        self.logger.record("eval/win_rate", win_rate)
        self.logger.record("eval/draw_rate", draw_rate)
        self.logger.record("eval/loss_rate", loss_rate)
        for seat, record in records.items():
            self.logger.record(f"eval/{str(seat)[:20]}/win_rate", record.win_rate)
        self.logger.record("time/total_timesteps", self.num_timesteps, exclude="tensorboard")
        self.logger.dump(self.num_timesteps)

        continue_training = True
        if win_rate > self.best_mean_reward:
            if self.verbose >= 1:
                print("New best win rate!")
            if self.best_model_save_path is not None:
                self.model.save(os.path.join(self.best_model_save_path, "best_model"))
            self.best_mean_reward = win_rate
            if self.callback_on_new_best is not None:
                continue_training = self.callback_on_new_best.on_step()
        if self.callback is not None:
            continue_training = continue_training and self._on_event()
        return continue_training

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

    vec_env = as_evaluation_env(env)
    team_returns, lengths = evaluation.evaluate_policy(
        acting_model(model, vec_env),
        vec_env,
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
