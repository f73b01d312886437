"""VMAS envs (``vmas.make_env(scenario, num_envs=N)``) as :class:`~sb3_ippo.vec_env.batched.BatchedParallelEnv`\\s.

:class:`VmasEnv` is a thin adapter: agent names as ids, VMAS's ``gym`` spaces as gymnasium's, actions as tensors on
the env's device, and the per-copy resets VMAS lacks (its ``reset_at(i)`` resets one copy and returns the whole batch).
It needs no import of VMAS: it talks to the env object it is given. ``pip install "sb3-ippo[vmas]"`` installs VMAS.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch as th
from gymnasium import spaces

from sb3_ippo.vec_env.base import AgentID


def gymnasium_space(space: Any) -> spaces.Space:
    """A VMAS (``gym``) space as the gymnasium space of the same kind, bounds and shape."""
    kind = type(space).__name__
    if kind == "Box":
        return spaces.Box(np.asarray(space.low), np.asarray(space.high), space.shape, space.dtype)  # type: ignore[arg-type]
    if kind == "Discrete":
        return spaces.Discrete(int(space.n), start=int(getattr(space, "start", 0)))
    if kind == "MultiDiscrete":
        return spaces.MultiDiscrete(np.asarray(space.nvec))
    if kind == "Dict":
        return spaces.Dict({key: gymnasium_space(sub) for key, sub in space.spaces.items()})
    raise TypeError(f"VMAS space {space} has no gymnasium counterpart here (Box, Discrete, MultiDiscrete or Dict expected)")


class VmasEnv:
    """A VMAS env as a :class:`~sb3_ippo.vec_env.batched.BatchedParallelEnv` (``IPPO(policy, vmas_env)`` wraps it so).

    Every VMAS agent is in every copy for the whole episode, and a copy's episode ends for all its agents at once (VMAS's
    ``done``); with ``terminated_truncated=False`` (VMAS's default) a done copy that reached ``max_steps`` is truncated,
    any other is terminated. VMAS has no automatic reset: :meth:`reset_copies` calls ``reset_at`` for each copy that
    ended (VMAS resets one index at a time) and reads the batch's observations once. VMAS seeds one random stream for all
    copies: ``reset(seed)`` seeds it with ``seed``.

    :param env: A ``vmas.simulator.environment.Environment`` (``vmas.make_env(...)`` without a ``wrapper``).
    """

    def __init__(self, env: Any) -> None:
        self.env = env
        self.num_envs = int(env.num_envs)
        self.possible_agents: list[AgentID] = [agent.name for agent in env.agents]
        self._actions = dict(zip(self.possible_agents, self._per_agent(env.action_space), strict=True))
        self._observations = dict(zip(self.possible_agents, self._per_agent(env.observation_space), strict=True))
        self.device = env.device
        self.render_mode = None

    def _per_agent(self, space: Any) -> list[spaces.Space]:
        subspaces = list(space.spaces.values()) if isinstance(space.spaces, Mapping) else list(space.spaces)
        return [gymnasium_space(sub) for sub in subspaces]

    def observation_space(self, agent: AgentID) -> spaces.Space:
        return self._observations[agent]

    def action_space(self, agent: AgentID) -> spaces.Space:
        return self._actions[agent]

    def _by_agent(self, values: Any) -> dict[AgentID, Any]:
        """VMAS's per-agent list (or dict, with ``dict_spaces=True``) as ``{agent_id: batch}``."""
        if isinstance(values, Mapping):
            return dict(values)
        return dict(zip(self.possible_agents, values, strict=True))

    def reset(self, seed: int | None = None) -> dict[AgentID, Any]:
        return self._by_agent(self.env.reset(seed=seed))

    def reset_copies(self, mask: np.ndarray) -> dict[AgentID, Any]:
        for env_idx in np.flatnonzero(mask).tolist():
            self.env.reset_at(env_idx, return_observations=False)
        (obs,) = self.env.get_from_scenario(
            get_observations=True, get_rewards=False, get_infos=False, get_dones=False, dict_agent_names=True
        )
        return obs

    def step(self, actions: Mapping[AgentID, np.ndarray]) -> tuple[dict, dict, dict, dict, Any]:
        env_actions = {
            agent: th.as_tensor(
                actions[agent],
                dtype=th.float32 if isinstance(self._actions[agent], spaces.Box) else th.long,
                device=self.device,
            )
            for agent in self.possible_agents
        }
        result = self.env.step(env_actions)
        if self.env.terminated_truncated:
            obs, rewards, terminated, truncated, infos = result
        else:
            obs, rewards, dones, infos = result
            if self.env.max_steps is None:
                truncated = th.zeros_like(dones)
            else:
                truncated = dones & (self.env.steps >= self.env.max_steps)
            terminated = dones & ~truncated
        return (
            self._by_agent(obs),
            self._by_agent(rewards),
            dict.fromkeys(self.possible_agents, terminated),
            dict.fromkeys(self.possible_agents, truncated),
            infos,
        )

    def close(self) -> None:
        viewer = getattr(self.env, "viewer", None)
        if viewer is not None:
            viewer.close()
