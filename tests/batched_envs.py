"""One game, two ways: :class:`TorchChaseEnv` steps ``num_envs`` copies as torch tensors (a natively batched env,
:class:`sb3_ippo.vec_env.batched.BatchedParallelEnv`), :class:`ChaseParallelEnv` is one copy as a PettingZoo
``ParallelEnv``. Given the same seeds and actions, copy ``i`` of the first and a ``ChaseParallelEnv`` seeded with
``seed + i`` play the same episodes, bit for bit (all positions are integers; every float is computed by the same
float32 operations).

The game ("chase"): on a line of cells ``-size..size``, each agent moves left, stays or moves right (Discrete(3))
towards a target cell. An agent that reaches the target leaves the episode (terminated, reward +1); one that steps off
the line dies (terminated, reward -1); any other step costs 0.1. The agents still there after ``max_steps`` steps are
truncated. Observation of an agent: ``[x / size, (target - x) / size, t / max_steps]`` (float32).

Each copy draws its target and starting cells from its own stream, a linear congruential generator: seeded with
``seed + i``, then advanced by every reset, so both versions draw the same cells with no shared random state.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
import torch as th
from gymnasium import spaces
from pettingzoo import ParallelEnv

MODULUS = 2**31


def _next_key(key: Any) -> Any:
    """One step of the stream (numpy ints, Python ints or int64 tensors alike: no product exceeds 2**62)."""
    return (key * 1103515245 + 12345) % MODULUS


def _spaces(n_agents: int) -> tuple[list[str], spaces.Box, spaces.Discrete]:
    agents = [f"agent_{j}" for j in range(n_agents)]
    return agents, spaces.Box(-3.0, 3.0, (3,), np.float32), spaces.Discrete(3)


class TorchChaseEnv:
    """``num_envs`` copies of the chase game, stepped as tensors of shape ``(num_envs, n_agents)``.

    Satisfies :class:`sb3_ippo.vec_env.batched.BatchedParallelEnv`: ``IPPO("MlpPolicy", TorchChaseEnv(64))`` trains on
    it, and ``make_vec_env(TorchChaseEnv, 64, vec_env_cls="batched")`` makes it.
    """

    metadata: ClassVar[dict[str, Any]] = {"name": "torch_chase_v0", "render_modes": []}

    def __init__(self, num_envs: int, n_agents: int = 3, size: int = 4, max_steps: int = 12, device: str = "cpu") -> None:
        self.num_envs = num_envs
        self.n_agents, self.size, self.max_steps = n_agents, size, max_steps
        self.possible_agents, self._obs_space, self._act_space = _spaces(n_agents)
        self.device = th.device(device)
        self.render_mode = None
        self.keys = 12345 + th.arange(num_envs, dtype=th.int64, device=self.device)
        self.x = th.zeros(num_envs, n_agents, dtype=th.int64, device=self.device)
        self.target = th.zeros(num_envs, dtype=th.int64, device=self.device)
        self.t = th.zeros(num_envs, dtype=th.int64, device=self.device)
        self.alive = th.zeros(num_envs, n_agents, dtype=th.bool, device=self.device)

    def observation_space(self, agent: str) -> spaces.Space:
        return self._obs_space

    def action_space(self, agent: str) -> spaces.Space:
        return self._act_space

    def _draw(self, mask: th.Tensor, n: int) -> th.Tensor:
        """The next number in ``0..n-1`` of each copy's stream, advancing the streams of the copies in ``mask``."""
        self.keys = th.where(mask, _next_key(self.keys), self.keys)
        return self.keys % n

    def _start(self, mask: th.Tensor) -> dict[str, th.Tensor]:
        size = self.size
        self.target = th.where(mask, self._draw(mask, 2 * size - 1) - (size - 1), self.target)
        for j in range(self.n_agents):
            self.x[:, j] = th.where(mask, self._draw(mask, 2 * size + 1) - size, self.x[:, j])
        self.t = th.where(mask, 0, self.t)
        self.alive = self.alive | mask[:, None]
        return self._observe()

    def _observe(self) -> dict[str, th.Tensor]:
        x = self.x.to(th.float32)
        to_target = (self.target[:, None] - self.x).to(th.float32)
        t = (self.t.to(th.float32) / self.max_steps)[:, None].expand(-1, self.n_agents)
        obs = th.stack([x / self.size, to_target / self.size, t], dim=-1)
        return {agent: obs[:, j] for j, agent in enumerate(self.possible_agents)}

    def reset(self, seed: int | None = None) -> dict[str, th.Tensor]:
        if seed is not None:
            self.keys = (seed + th.arange(self.num_envs, dtype=th.int64, device=self.device)) % MODULUS
        everyone = th.ones(self.num_envs, dtype=th.bool, device=self.device)
        self.alive = th.zeros_like(self.alive)
        return self._start(everyone)

    def reset_copies(self, mask: np.ndarray) -> dict[str, th.Tensor]:
        mask_t = th.as_tensor(mask, dtype=th.bool, device=self.device)
        self.alive = self.alive & ~mask_t[:, None]
        return self._start(mask_t)

    def step(self, actions: dict[str, np.ndarray]) -> tuple[dict, dict, dict, dict, dict]:
        moves = th.stack([th.as_tensor(actions[agent], device=self.device) for agent in self.possible_agents], dim=1) - 1
        acting = self.alive
        self.x = th.where(acting, self.x + moves, self.x)
        self.t = self.t + 1
        reached = acting & (self.x == self.target[:, None])
        fell = acting & (self.x.abs() > self.size)
        terminated = reached | fell
        truncated = acting & ~terminated & (self.t >= self.max_steps)[:, None]
        reward = th.where(reached, 1.0, th.where(fell, -1.0, -0.1)).to(th.float32)
        reward = th.where(acting, reward, 0.0)
        self.alive = acting & ~(terminated | truncated)
        obs = self._observe()
        by_agent = lambda values: {agent: values[:, j] for j, agent in enumerate(self.possible_agents)}  # noqa: E731
        return obs, by_agent(reward), by_agent(terminated), by_agent(truncated), {}


class ChaseParallelEnv(ParallelEnv):
    """One copy of the chase game as a PettingZoo ``ParallelEnv`` (numpy float32), the same game as
    :class:`TorchChaseEnv`."""

    metadata: ClassVar[dict[str, Any]] = {"name": "chase_v0", "render_modes": [], "is_parallelizable": True}

    def __init__(self, n_agents: int = 3, size: int = 4, max_steps: int = 12) -> None:
        self.n_agents, self.size, self.max_steps = n_agents, size, max_steps
        self.possible_agents, self._obs_space, self._act_space = _spaces(n_agents)
        self.agents: list[str] = []
        self.render_mode = None
        self.key = 12345
        self.x = np.zeros(n_agents, dtype=np.int64)
        self.target = 0
        self.t = 0

    def observation_space(self, agent: str) -> spaces.Space:
        return self._obs_space

    def action_space(self, agent: str) -> spaces.Space:
        return self._act_space

    def _draw(self, n: int) -> int:
        self.key = _next_key(self.key)
        return self.key % n

    def _observe(self, agent: str) -> np.ndarray:
        j = self.possible_agents.index(agent)
        x, to_target = np.float32(self.x[j]), np.float32(self.target - self.x[j])
        size, t = np.float32(self.size), np.float32(self.t) / np.float32(self.max_steps)
        return np.array([x / size, to_target / size, t], dtype=np.float32)

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        if seed is not None:
            self.key = seed % MODULUS
        size = self.size
        self.target = self._draw(2 * size - 1) - (size - 1)
        for j in range(self.n_agents):
            self.x[j] = self._draw(2 * size + 1) - size
        self.t = 0
        self.agents = list(self.possible_agents)
        return {agent: self._observe(agent) for agent in self.agents}, {agent: {} for agent in self.agents}

    def step(self, actions: dict[str, Any]) -> tuple[dict, dict, dict, dict, dict]:
        acting = list(self.agents)
        for agent in acting:
            self.x[self.possible_agents.index(agent)] += int(actions[agent]) - 1
        self.t += 1
        rewards, terminations, truncations = {}, {}, {}
        for agent in acting:
            x = self.x[self.possible_agents.index(agent)]
            reached, fell = x == self.target, abs(x) > self.size
            rewards[agent] = np.float32(1.0 if reached else -1.0 if fell else -0.1)
            terminations[agent] = bool(reached or fell)
            truncations[agent] = not terminations[agent] and self.t >= self.max_steps
        obs = {agent: self._observe(agent) for agent in acting}
        self.agents = [agent for agent in acting if not (terminations[agent] or truncations[agent])]
        return obs, rewards, terminations, truncations, {agent: {} for agent in acting}
