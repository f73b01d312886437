"""Evaluation of games: a model's win, draw and loss rates in each seat against an opponent.

``evaluate_policy(model, env, opponent="random")`` (:func:`sb3_ippo.evaluate_policy`) calls :func:`evaluate_game`:
for each seat, the model plays that seat and the opponent every other seat, for ``n_eval_episodes`` games. A game
is won when the seat's return is greater than every other seat's, drawn when it ties the best, lost otherwise
(the classic games pay +1 / -1 / 0). The model and a recurrent opponent remember as in collection: each seat's state
carried in each env copy from its first move of the game (:mod:`sb3_ippo.common.acting`).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from sb3_ippo.common.acting import CarriedStates, predict_agent
from sb3_ippo.games.self_play import FrozenSeats, make_opponent
from sb3_ippo.vec_env import AgentID, MultiAgentVecEnv, as_multiagent_vec_env


@dataclass(frozen=True)
class SeatRecord:
    """A seat's results: games won, drawn and lost (and the rates)."""

    wins: int
    draws: int
    losses: int

    @property
    def n_games(self) -> int:
        return self.wins + self.draws + self.losses

    @property
    def win_rate(self) -> float:
        return self.wins / max(self.n_games, 1)

    @property
    def draw_rate(self) -> float:
        return self.draws / max(self.n_games, 1)

    @property
    def loss_rate(self) -> float:
        return self.losses / max(self.n_games, 1)

    @property
    def non_loss_rate(self) -> float:
        return 1.0 - self.loss_rate if self.n_games else 0.0

    def __str__(self) -> str:
        return f"win {self.win_rate:.1%}, draw {self.draw_rate:.1%}, loss {self.loss_rate:.1%} ({self.n_games} games)"


def outcome(agent_returns: dict[AgentID, float], seat: AgentID) -> int:
    """+1 (won: the seat's return beats every other seat's), 0 (drawn: it ties the best) or -1 (lost)."""
    others = [value for agent, value in agent_returns.items() if agent != seat]
    best_other = max(others) if others else float("-inf")
    mine = agent_returns.get(seat, 0.0)
    return 1 if mine > best_other else (0 if mine == best_other else -1)


def evaluate_game(
    model: Any,
    env: Any,
    opponent: Any = "random",
    n_eval_episodes: int = 100,
    deterministic: bool = True,
    seats: Sequence[AgentID] | None = None,
    seed: int | None = None,
) -> dict[AgentID, SeatRecord]:
    """Play ``n_eval_episodes`` games in each seat: the model in that seat, ``opponent`` in every other.

    :param model: An IPPO model (anything whose ``predict`` maps ``{agent_id: obs}`` to ``{agent_id: action}``).
    :param env: A PettingZoo env (AEC or parallel) or ``make_vec_env(...)``. Its copies are reset first; with several
        copies, games are spread evenly over them, as SB3 does.
    :param opponent: ``"random"`` (uniform among legal moves), a model or policy with ``predict`` (it samples its
        moves), or a function of the batched observations.
    :param deterministic: Whether the model plays its most likely legal moves.
    :param seats: The seats to evaluate (default: every agent).
    :param seed: Seed of a random opponent.
    :return: ``{seat: SeatRecord}``.
    """
    vec_env = as_multiagent_vec_env(env)
    seats = list(vec_env.possible_agents if seats is None else seats)
    unknown = [seat for seat in seats if seat not in vec_env.possible_agents]
    if unknown:
        raise ValueError(f"Unknown seats {unknown}: the env's agents are {vec_env.possible_agents}")
    if len(vec_env.possible_agents) < 2:
        raise ValueError("Win, draw and loss rates need an env of at least two agents")
    player = make_opponent(opponent, vec_env.action_spaces, seed)
    return {seat: _play_seat(model, vec_env, player, seat, n_eval_episodes, deterministic) for seat in seats}


def _play_seat(
    model: Any, env: MultiAgentVecEnv, player: Any, seat: AgentID, n_eval_episodes: int, deterministic: bool
) -> SeatRecord:
    n_envs = env.num_envs
    frozen = FrozenSeats(env.possible_agents, {agent: player for agent in env.possible_agents if agent != seat})
    states = CarriedStates(n_envs)
    predict = functools.partial(predict_agent, model, deterministic=deterministic)
    targets = np.array([(n_eval_episodes + i) // n_envs for i in range(n_envs)], dtype=int)
    counts = np.zeros(n_envs, dtype=int)
    results = {1: 0, 0: 0, -1: 0}
    obs = env.reset()
    alive = env.alive
    while (counts < targets).any():
        actions: dict[AgentID, np.ndarray] = {}
        rows = frozen.learning(alive)[seat]
        if rows.any():
            moves = states.act(predict, seat, rows, obs[seat])
            space = env.action_spaces[seat]
            actions[seat] = np.zeros((n_envs, *(space.shape or ())), dtype=space.dtype)
            actions[seat][rows] = moves.reshape(int(rows.sum()), *(space.shape or ()))
        frozen.play(obs, alive, actions, env.action_spaces)
        step = env.step_agents(actions)
        states.end_episodes(step.dones)
        frozen.start_episodes(step.dones)
        for env_idx in np.flatnonzero(step.dones).tolist():
            if counts[env_idx] < targets[env_idx]:
                results[outcome(step.infos[env_idx]["episode"]["agent_returns"], seat)] += 1
                counts[env_idx] += 1
        obs, alive = step.obs, step.alive
    return SeatRecord(wins=results[1], draws=results[0], losses=results[-1])
