"""Turn-based env copies: PettingZoo AEC envs that cannot run in parallel (the classic games), stepped turn by turn.

Each vectorized step advances every copy by one turn: the agent to move in a copy is the only one alive there, it
acts, and the copy moves on to the next agent to move (stepping the agents whose episode ended out of the env, as
the AEC API asks). The step reports, for every agent of a copy, what AEC's ``last()`` reports for it when it is next
selected: the reward it accumulated since its last move, and whether its episode ended.

So each agent's transition runs from its turn to its next turn (or to the end of its episode), and its reward is
everything it received in between, the other players' replies included:

- for the agent that moved, a reward or an episode end in the same step belongs to the move it just made (its move
  won the game, or it moves again at once);
- for every other agent, the reward and episode end reported belong to its *last* move in that copy: the learner
  adds the reward to that transition and closes the trajectory at an episode end
  (:meth:`sb3_ippo.common.buffer.AgentEpisodeBuffer.credit`). An episode end reaches every agent, also the one whose last
  move came earlier (the loser of a game learns that its last move lost).

Per-episode statistics are those of every copy: team return, per-agent returns, length (in moves). A copy whose env
raises is handled as every copy is (``on_env_error``: raise, or rebuild it and lose only its game in progress).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from gymnasium import spaces
from pettingzoo import AECEnv

from sb3_ippo.games.masking import MASK_KEY
from sb3_ippo.vec_env.base import DEFAULT_MAX_RESTARTS, AgentID
from sb3_ippo.vec_env.copies import CopyStep
from sb3_ippo.vec_env.dummy import DummyMultiAgentVecEnv


def needs_turns(env: Any) -> bool:
    """Whether ``env`` is an AEC env that PettingZoo cannot run in parallel (metadata ``is_parallelizable`` False)."""
    return isinstance(env, AECEnv) and not env.metadata.get("is_parallelizable", False)


def illegal_action_message(agent: AgentID, action: Any, mask: np.ndarray, action_space: spaces.Space) -> str | None:
    """Why ``action`` is illegal under ``mask`` (None if it is legal), naming the agent and its legal moves."""
    mask = np.asarray(mask).astype(bool).reshape(-1)
    if isinstance(action_space, spaces.Discrete):
        choice = int(action) - int(action_space.start)
        if 0 <= choice < len(mask) and mask[choice]:
            return None
        legal = (np.flatnonzero(mask) + int(action_space.start)).tolist()
        return f"agent {agent!r} chose action {int(action)}, which its action_mask forbids (legal moves: {legal})"
    if isinstance(action_space, (spaces.MultiDiscrete, spaces.MultiBinary)):
        if isinstance(action_space, spaces.MultiDiscrete):
            sizes = action_space.nvec.reshape(-1)
        else:
            sizes = np.full(int(np.prod(action_space.shape)), 2)
        choices = np.asarray(action).reshape(-1)
        offset = 0
        for dimension, (size, choice) in enumerate(zip(sizes, choices, strict=True)):
            if not mask[offset + int(choice)]:
                legal = np.flatnonzero(mask[offset : offset + int(size)]).tolist()
                return (
                    f"agent {agent!r} chose {int(choice)} in action dimension {dimension}, which its action_mask forbids "
                    f"(legal there: {legal})"
                )
            offset += int(size)
        return None
    return None


class TurnBasedCopy:
    """One copy of an AEC env, stepped one turn at a time; it resets itself when its episode ends.

    It has the interface of the parallel copies (``reset``, ``step``, ``alive``), so the vectorized env's per-agent
    arrays, alive masks, statistics and restarts work unchanged: the only agent alive in a copy is the one to move.
    An action its ``action_mask`` forbids is refused before it reaches the env.
    """

    def __init__(self, env: AECEnv, max_episode_steps: int | None = None) -> None:
        self.env = env
        self.max_episode_steps = max_episode_steps
        self.possible_agents = list(env.possible_agents)
        self.to_move: AgentID | None = None
        self._obs: Any = None
        self.episode_length = 0
        self.team_return = 0.0
        self.agent_returns: dict[AgentID, float] = {}
        self.episode_start = time.time()

    @property
    def alive(self) -> dict[AgentID, None]:
        """The agent to move (none once the episode is over)."""
        return {} if self.to_move is None else {self.to_move: None}

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        self.env.reset(seed=seed, options=options or None)
        self.episode_length = 0
        self.team_return = 0.0
        self.agent_returns = {agent: 0.0 for agent in self.possible_agents}
        self.episode_start = time.time()
        # Rewards before the first move (rare) count in the returns; no transition is there to take them.
        rewards, _, _, _, infos = self._advance()
        self._count(rewards)
        if self.to_move is None:
            raise RuntimeError(f"{self.env} has no agent to move after reset: its episode ended before it began")
        return {self.to_move: self._obs}, infos

    def step(self, actions: dict[AgentID, Any]) -> CopyStep:
        """The agent to move acts; then the copy advances to the next agent to move, or to the episode end (``done``:
        the caller resets the copy).

        :return: the step as the parallel copies return it; ``rewards`` and the ends cover every agent that ``last()``
            reported on.
        :raises ValueError: for a missing or illegal action (the env is not stepped).
        """
        agent = self.to_move
        assert agent is not None
        if agent not in actions:
            raise ValueError(f"It is agent {agent!r}'s turn, but the actions are for {sorted(actions)}")
        action = actions[agent]
        self.check_legal(agent, action)
        self.env.step(action)
        self.episode_length += 1
        rewards, terminations, truncations, final_obs, infos = self._advance()
        if self.to_move is not None and self.max_episode_steps is not None and self.episode_length >= self.max_episode_steps:
            self._truncate_all(rewards, terminations, truncations, final_obs)
        self._count(rewards)
        agents = list(rewards)
        terminations = {a: terminations.get(a, False) for a in agents}
        truncations = {a: truncations.get(a, False) for a in agents}
        if self.to_move is None:
            episode = {
                "r": self.team_return,
                "l": self.episode_length,
                "t": round(time.time() - self.episode_start, 6),
                "agent_returns": dict(self.agent_returns),
            }
            return CopyStep({}, rewards, terminations, truncations, infos, {}, True, final_obs, episode)
        obs = {self.to_move: self._obs}
        return CopyStep(obs, rewards, terminations, truncations, infos, self.alive, False, final_obs, None)

    def check_legal(self, agent: AgentID, action: Any) -> None:
        """:raises ValueError: if the observation the agent acts on has an action mask that forbids ``action``."""
        if isinstance(self._obs, dict) and MASK_KEY in self._obs:
            message = illegal_action_message(agent, action, self._obs[MASK_KEY], self.env.action_space(agent))
            if message is not None:
                raise ValueError(f"Illegal move refused before it reached the env: {message}")

    def _advance(self) -> tuple[dict, dict, dict, dict, dict]:
        """Read ``last()`` for each selected agent until one is alive and to move: an agent whose episode ended is
        recorded (reward, end, final observation) and stepped out of the env with ``None``. ``to_move`` is then that
        agent, or None when no agent is left (the episode is over)."""
        rewards: dict[AgentID, float] = {}
        terminations: dict[AgentID, bool] = {}
        truncations: dict[AgentID, bool] = {}
        final_obs: dict[AgentID, Any] = {}
        infos: dict[AgentID, Any] = {}
        self.to_move = None
        while self.env.agents:
            agent = self.env.agent_selection
            obs, reward, terminated, truncated, info = self.env.last()
            rewards[agent] = rewards.get(agent, 0.0) + float(reward)
            infos[agent] = info
            if terminated or truncated:
                terminations[agent] = bool(terminated)
                truncations[agent] = not terminated
                final_obs[agent] = obs
                self.env.step(None)
                continue
            self.to_move = agent
            self._obs = obs
            break
        return rewards, terminations, truncations, final_obs, infos

    def _truncate_all(self, rewards: dict, terminations: dict, truncations: dict, final_obs: dict) -> None:
        """The time limit: every agent still in the episode is truncated, with the reward it has not been told yet."""
        cumulative = getattr(self.env, "_cumulative_rewards", {})
        for agent in list(self.env.agents):
            if agent != self.to_move:
                # The agent to move was read by last() already; the others' rewards since their last move wait here.
                rewards[agent] = rewards.get(agent, 0.0) + float(cumulative.get(agent, 0.0))
            terminations[agent] = False
            truncations[agent] = True
            final_obs[agent] = self._obs if agent == self.to_move else self.env.observe(agent)
        self.to_move = None

    def _count(self, rewards: dict[AgentID, float]) -> None:
        for agent, reward in rewards.items():
            self.agent_returns[agent] = self.agent_returns.get(agent, 0.0) + reward
            self.team_return += reward


class TurnBasedMultiAgentVecEnv(DummyMultiAgentVecEnv):
    """``n_envs`` copies of a turn-based (AEC) env, stepped in this process, one turn per copy per step.

    In each copy only the agent to move is alive (``alive[agent][i]``); ``step_agents`` takes actions for every agent
    and uses those of the agents to move. ``rewards``, ``terminations`` and ``truncations`` of an agent that did not
    move in a copy are those of its last move there (see the module's docstring). Copies run in this process: a
    game's step costs microseconds, far less than the policy's forward pass.

    :param env_fns: Factories of AEC envs, one per copy.
    :param max_episode_steps: Truncate every copy's episode after this many moves (None: the env decides).
    :param on_env_error: ``"raise"`` or ``"restart"`` a copy whose env raises (see ``MultiAgentVecEnv``). An illegal
        move is never an env error: it always raises.
    :param max_restarts: With ``"restart"``, the restarts allowed in all.
    :param first_env: An env already made by ``env_fns[0]`` (``make_vec_env``'s probe), used as copy 0; a restart of
        copy 0 still makes a new one from ``env_fns[0]``.
    """

    turn_based = True

    @staticmethod
    def _make_copy(env: Any, max_episode_steps: int | None) -> TurnBasedCopy:  # type: ignore[override]
        if not isinstance(env, AECEnv):
            raise TypeError(f"TurnBasedMultiAgentVecEnv steps PettingZoo AEC envs, got {type(env).__name__}: {env!r}")
        return TurnBasedCopy(env, max_episode_steps)

    def _check_actions(self, per_copy: list[dict[AgentID, Any]]) -> None:
        # Every copy's move is checked before any copy steps: an illegal move leaves all copies as they were.
        for episode_copy, actions in zip(self._copies, per_copy, strict=True):
            assert isinstance(episode_copy, TurnBasedCopy) and episode_copy.to_move is not None
            if episode_copy.to_move in actions:
                episode_copy.check_legal(episode_copy.to_move, actions[episode_copy.to_move])


def make_turn_based_vec_env(
    env_fns: Sequence[Callable[[], Any]],
    vec_env_cls: str,
    on_env_error: str = "raise",
    max_restarts: int = DEFAULT_MAX_RESTARTS,
    first_env: Any = None,
) -> TurnBasedMultiAgentVecEnv:
    """The vectorized env ``make_vec_env`` builds for a turn-based env.

    :raises ValueError: for ``vec_env_cls`` other than ``"dummy"``: turn-based copies run in this process.
    """
    if vec_env_cls != "dummy":
        raise ValueError(
            f"vec_env_cls={vec_env_cls!r}: turn-based (AEC) envs run their copies in this process; use "
            "vec_env_cls='dummy' (a game's step is cheap next to the policy's forward pass)"
        )
    return TurnBasedMultiAgentVecEnv(env_fns, on_env_error=on_env_error, max_restarts=max_restarts, first_env=first_env)


def is_turn_based_vec_env(env: Any) -> bool:
    """Whether a vectorized env steps its copies turn by turn (rewards of agents that did not move are theirs)."""
    return bool(getattr(env, "turn_based", False))


__all__ = [
    "TurnBasedCopy",
    "TurnBasedMultiAgentVecEnv",
    "illegal_action_message",
    "is_turn_based_vec_env",
    "make_turn_based_vec_env",
    "needs_turns",
]
