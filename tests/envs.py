"""Small deterministic PettingZoo parallel envs for the tests.

Each env is cheap (no physics, no rendering), seeded only through ``reset(seed=...)``, and pays rewards that are
simple functions of the current observation and action, so a learner can learn them:

- :class:`DyingAgentsEnv`: agents leave (terminated) at their own death steps; agents may also join late.
- :class:`RevivingEnv`: a broken env that brings dead agents back, to show the vectorized env does not.
- :class:`HeterogeneousEnv`: one agent per space type: Discrete, Box, MultiDiscrete and MultiBinary actions;
  vector, Dict and uint8 image observations.
- :class:`VariableLengthEnv`: the episode length is drawn from the seed, so copies end at different steps.
- :class:`CrashingEnv`: raises, or kills its process, at a given step (for subprocess worker failures);
  :class:`FactoryThatFailsInWorkers` makes a worker die while it starts.
- :class:`CartPoleParallelEnv`: gymnasium's CartPole-v1 as a one-agent parallel env.
- :class:`CueMemoryEnv`: each agent sees a cue only at the first step and is paid for repeating it ``delay`` steps
  later: a task for memory (recurrent policies), at chance level without it.

All but :class:`RevivingEnv` and :class:`CrashingEnv` pass ``pettingzoo.test.parallel_api_test``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from pettingzoo import ParallelEnv

AgentID = str


class _TestEnv(ParallelEnv):
    """What the test envs share: fixed spaces per agent, a seeded generator, and no rendering."""

    metadata: ClassVar[dict[str, Any]] = {"name": "test_env", "render_modes": [], "is_parallelizable": True}

    def __init__(self, observation_spaces: Mapping[AgentID, spaces.Space], action_spaces: Mapping[AgentID, spaces.Space]):
        self.possible_agents = list(observation_spaces)
        self.render_mode = None
        # PettingZoo asks observation_space(agent) to return the same object every time.
        self.observation_spaces = dict(observation_spaces)
        self.action_spaces = dict(action_spaces)
        self.agents: list[AgentID] = []
        self.rng = np.random.default_rng()
        self.steps = 0
        self.last_actions: dict[AgentID, Any] = {}

    def observation_space(self, agent: AgentID) -> spaces.Space:
        return self.observation_spaces[agent]

    def action_space(self, agent: AgentID) -> spaces.Space:
        return self.action_spaces[agent]

    def _reset_rng(self, seed: int | None) -> None:
        # Like gymnasium: a seed restarts the generator, no seed continues it.
        if seed is not None:
            self.rng = np.random.default_rng(seed)

    def _check_actions(self, actions: Mapping[AgentID, Any]) -> None:
        """Refuse what a strict env would: an action for an agent that is not live, or a live agent without one."""
        if set(actions) != set(self.agents):
            raise ValueError(f"Actions for {sorted(actions)}, but the live agents are {sorted(self.agents)}")
        for agent, action in actions.items():
            shape = self.action_spaces[agent].shape
            if np.shape(action) != shape:
                raise ValueError(f"Action {action!r} of agent {agent!r} has shape {np.shape(action)}; expected {shape}")
        self.last_actions = dict(actions)

    def render(self) -> None:
        return None

    def close(self) -> None:
        pass


class DyingAgentsEnv(_TestEnv):
    """Agents leave at their own death steps; the ones still there are truncated after ``max_steps`` steps.

    Observation of every agent: ``[t / max_steps, target]`` (Box float32 of shape (2,)), where ``t`` is the number
    of steps since reset and ``target = (t + index of the agent) % 2``. Action: Discrete(2) (or ``action_space``).
    Reward: ``reward_scale`` if the action equals the target of the observation it answers, else 0; for a Box or
    MultiDiscrete ``action_space``, its first entry is the answer (a Box pays ``reward_scale * (1 - |a - target|)``).

    :param death_steps: Agent id -> the step (counted from 1 after reset) after which the agent is terminated and
        removed; None: it stays until truncated. The keys are the possible agents, in order.
    :param max_steps: Episode length for the agents that do not die.
    :param join_steps: Agent id -> the step after which that agent joins: it is absent at reset and until then.
    :param reward_scale: Reward of a right action (settable with ``set_attr``).
    :param action_space: Every agent's action space: Discrete(2) (default), a Box or a MultiDiscrete.
    """

    metadata: ClassVar[dict[str, Any]] = {"name": "dying_agents_v0", "render_modes": [], "is_parallelizable": True}

    def __init__(
        self,
        death_steps: Mapping[AgentID, int | None] | None = None,
        max_steps: int = 6,
        join_steps: Mapping[AgentID, int] | None = None,
        reward_scale: float = 1.0,
        action_space: spaces.Space | None = None,
    ) -> None:
        if death_steps is None:
            death_steps = {"agent_0": 2, "agent_1": 4, "agent_2": None}
        agents = list(death_steps)
        super().__init__(
            {agent: spaces.Box(0.0, 1.0, (2,), np.float32) for agent in agents},
            {agent: action_space if action_space is not None else spaces.Discrete(2) for agent in agents},
        )
        self.death_steps = dict(death_steps)
        self.join_steps = dict(join_steps or {})
        self.max_steps = max_steps
        self.reward_scale = reward_scale
        self._left: set[AgentID] = set()

    def target(self, agent: AgentID, t: int) -> int:
        return (t + self.possible_agents.index(agent)) % 2

    def _observe(self, agent: AgentID) -> np.ndarray:
        return np.array([self.steps / self.max_steps, self.target(agent, self.steps)], dtype=np.float32)

    def _reward(self, agent: AgentID, action: Any) -> float:
        target = self.target(agent, self.steps)
        if isinstance(self.action_spaces[agent], spaces.Box):
            return self.reward_scale * (1.0 - abs(float(np.clip(np.ravel(action)[0], 0.0, 1.0)) - target))
        return self.reward_scale * float(int(np.ravel(action)[0]) == target)

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        self._reset_rng(seed)
        self.steps = 0
        self._left = set()
        self.agents = [agent for agent in self.possible_agents if agent not in self.join_steps]
        return {agent: self._observe(agent) for agent in self.agents}, {agent: {} for agent in self.agents}

    def step(self, actions: dict[AgentID, Any]) -> tuple[dict, dict, dict, dict, dict]:
        self._check_actions(actions)
        rewards = {agent: self._reward(agent, actions[agent]) for agent in self.agents}
        self.steps += 1
        joining = [
            agent
            for agent, step in self.join_steps.items()
            if step == self.steps and agent not in self.agents and agent not in self._left
        ]
        rewards.update({agent: 0.0 for agent in joining})
        present = [agent for agent in self.possible_agents if agent in self.agents or agent in joining]
        terminations = {agent: self.death_steps[agent] == self.steps for agent in present}
        truncations = {agent: self.steps >= self.max_steps and not terminations[agent] for agent in present}
        observations = {agent: self._observe(agent) for agent in present}
        infos: dict[AgentID, dict] = {agent: {} for agent in present}
        self.agents = [agent for agent in present if not terminations[agent] and not truncations[agent]]
        self._left |= set(present) - set(self.agents)
        return observations, rewards, terminations, truncations, infos


class RevivingEnv(DyingAgentsEnv):
    """A broken env: agents that died come back (observations, and in ``agents``) ``revive_after`` steps later.

    PettingZoo forbids this; it is here to show that the vectorized env does not revive them within an episode.
    """

    metadata: ClassVar[dict[str, Any]] = {"name": "reviving_v0", "render_modes": [], "is_parallelizable": True}

    def __init__(self, revive_after: int = 1, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.revive_after = revive_after

    def _check_actions(self, actions: Mapping[AgentID, Any]) -> None:
        # The revived agents are in `agents` but were never given back to the learner: they get no action.
        self.last_actions = dict(actions)

    def step(self, actions: dict[AgentID, Any]) -> tuple[dict, dict, dict, dict, dict]:
        observations, rewards, terminations, truncations, infos = super().step(
            {agent: actions.get(agent, 0) for agent in self.agents}
        )
        revived = [
            agent
            for agent, step in self.death_steps.items()
            if step is not None and step + self.revive_after <= self.steps < self.max_steps and agent not in self.agents
        ]
        for agent in revived:
            self.agents.append(agent)
            observations[agent] = self._observe(agent)
            rewards[agent], terminations[agent], truncations[agent], infos[agent] = 0.0, False, False, {}
        return observations, rewards, terminations, truncations, infos


def _heterogeneous_spaces() -> dict[AgentID, tuple[spaces.Space, spaces.Space]]:
    return {
        "discrete": (spaces.Box(-1.0, 1.0, (3,), np.float32), spaces.Discrete(3)),
        "box": (spaces.Box(-1.0, 1.0, (4,), np.float32), spaces.Box(-1.0, 1.0, (2,), np.float32)),
        "multi_discrete": (spaces.Box(-1.0, 1.0, (5,), np.float32), spaces.MultiDiscrete([2, 3])),
        "multi_binary": (spaces.Box(-1.0, 1.0, (6,), np.float32), spaces.MultiBinary(3)),
        "dict": (
            spaces.Dict({"features": spaces.Box(-1.0, 1.0, (2,), np.float32), "mode": spaces.Discrete(2)}),
            spaces.Discrete(2),
        ),
        "image": (spaces.Box(0, 255, (36, 36, 3), np.uint8), spaces.Discrete(2)),
    }


HETEROGENEOUS_AGENTS = tuple(_heterogeneous_spaces())


class HeterogeneousEnv(_TestEnv):
    """One agent per kind of space. Each step, every agent gets a fresh random observation and is paid for one action.

    ======================  ============================  ====================  =====================================
    agent                   observation                   action                reward (in [0, 1], or <= 0 for box)
    ======================  ============================  ====================  =====================================
    ``"discrete"``          Box (3,)                      Discrete(3)           1 if action == argmax(obs)
    ``"box"``               Box (4,)                      Box(-1, 1, (2,))      -mean((action - obs[:2]) ** 2)
    ``"multi_discrete"``    Box (5,)                      MultiDiscrete([2,3])  mean of [a0 == (obs[0] > 0),
                                                                                a1 == argmax(obs[1:4])]
    ``"multi_binary"``      Box (6,)                      MultiBinary(3)        mean of action == (obs[:3] > 0)
    ``"dict"``              Dict(features (2,), mode 0/1) Discrete(2)           1 if action == mode
    ``"image"``             uint8 (36, 36, 3), all 0/255  Discrete(2)           1 if action == (image is bright)
    ======================  ============================  ====================  =====================================

    Every episode lasts ``max_steps`` steps and ends truncated.

    :param agents: The agents to include (default: all of :data:`HETEROGENEOUS_AGENTS`).
    :param max_steps: Episode length.
    """

    metadata: ClassVar[dict[str, Any]] = {"name": "heterogeneous_v0", "render_modes": [], "is_parallelizable": True}

    def __init__(self, agents: Sequence[AgentID] | None = None, max_steps: int = 4) -> None:
        all_spaces = _heterogeneous_spaces()
        chosen = list(agents) if agents is not None else list(all_spaces)
        unknown = set(chosen) - set(all_spaces)
        if unknown:
            raise ValueError(f"Unknown agents {sorted(unknown)}; choose from {list(all_spaces)}")
        super().__init__({agent: all_spaces[agent][0] for agent in chosen}, {agent: all_spaces[agent][1] for agent in chosen})
        self.max_steps = max_steps
        self._obs: dict[AgentID, Any] = {}

    def _draw(self, agent: AgentID) -> Any:
        if agent == "dict":
            return {
                "features": self.rng.uniform(-1.0, 1.0, 2).astype(np.float32),
                "mode": int(self.rng.integers(2)),
            }
        if agent == "image":
            return np.full((36, 36, 3), 255 * int(self.rng.integers(2)), dtype=np.uint8)
        return self.rng.uniform(-1.0, 1.0, self.observation_spaces[agent].shape).astype(np.float32)

    def _reward(self, agent: AgentID, obs: Any, action: Any) -> float:
        if agent == "discrete":
            return float(int(action) == int(np.argmax(obs)))
        if agent == "box":
            return -float(np.mean((np.clip(action, -1.0, 1.0) - obs[:2]) ** 2))
        if agent == "multi_discrete":
            return float(np.mean([action[0] == int(obs[0] > 0), action[1] == int(np.argmax(obs[1:4]))]))
        if agent == "multi_binary":
            return float(np.mean(np.asarray(action) == (obs[:3] > 0)))
        if agent == "dict":
            return float(int(action) == obs["mode"])
        return float(int(action) == int(obs[0, 0, 0] > 127))

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        self._reset_rng(seed)
        self.steps = 0
        self.agents = list(self.possible_agents)
        self._obs = {agent: self._draw(agent) for agent in self.agents}
        return dict(self._obs), {agent: {} for agent in self.agents}

    def step(self, actions: dict[AgentID, Any]) -> tuple[dict, dict, dict, dict, dict]:
        self._check_actions(actions)
        rewards = {agent: self._reward(agent, self._obs[agent], actions[agent]) for agent in self.agents}
        self.steps += 1
        self._obs = {agent: self._draw(agent) for agent in self.agents}
        truncated = self.steps >= self.max_steps
        terminations = {agent: False for agent in self.agents}
        truncations = {agent: truncated for agent in self.agents}
        infos: dict[AgentID, dict] = {agent: {} for agent in self.agents}
        observations = dict(self._obs)
        if truncated:
            self.agents = []
        return observations, rewards, terminations, truncations, infos


class VariableLengthEnv(DyingAgentsEnv):
    """All agents end together, after a number of steps drawn at each reset from the env's seeded generator.

    Observations, actions and rewards are those of :class:`DyingAgentsEnv` (with ``max_length`` in place of
    ``max_steps``). Copies seeded differently end at different steps; ``episode_length`` is the drawn length.

    :param n_agents: Number of agents.
    :param min_length: Shortest episode.
    :param max_length: Longest episode.
    :param truncate: End episodes truncated (as a time limit does) instead of terminated.
    """

    metadata: ClassVar[dict[str, Any]] = {"name": "variable_length_v0", "render_modes": [], "is_parallelizable": True}

    def __init__(self, n_agents: int = 2, min_length: int = 2, max_length: int = 9, truncate: bool = False) -> None:
        super().__init__(death_steps={f"agent_{i}": None for i in range(n_agents)}, max_steps=max_length)
        self.min_length = min_length
        self.truncate = truncate
        self.episode_length = max_length

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        observations, infos = super().reset(seed, options)
        self.episode_length = int(self.rng.integers(self.min_length, self.max_steps + 1))
        return observations, infos

    def step(self, actions: dict[AgentID, Any]) -> tuple[dict, dict, dict, dict, dict]:
        observations, rewards, terminations, truncations, infos = super().step(actions)
        if self.steps >= self.episode_length:
            terminations = {agent: not self.truncate for agent in observations}
            truncations = {agent: self.truncate for agent in observations}
            self.agents = []
        return observations, rewards, terminations, truncations, infos


class CueMemoryEnv(_TestEnv):
    """A memory task: each agent is shown its own cue (0 or 1, drawn at reset) at the first step only, and is paid
    ``1`` for answering it when asked, ``delay`` steps later (the last step of the episode); every other step pays 0.

    Observation of every agent: ``[cue == 0, cue == 1, asked]`` (Box float32 of shape (3,)): the cue's one-hot at the
    first step and zeros after it, ``asked`` 1 at the last step. Action: Discrete(2), the answer (ignored until
    asked). An episode lasts ``delay + 1`` steps and ends terminated. The best team return is ``n_agents``; a policy
    without memory answers at chance, ``n_agents / 2`` in expectation.

    :param n_agents: Number of agents.
    :param delay: Steps between the cue and the question (at least 1).
    """

    metadata: ClassVar[dict[str, Any]] = {"name": "cue_memory_v0", "render_modes": [], "is_parallelizable": True}

    def __init__(self, n_agents: int = 2, delay: int = 4) -> None:
        agents = [f"agent_{i}" for i in range(n_agents)]
        super().__init__(
            {agent: spaces.Box(0.0, 1.0, (3,), np.float32) for agent in agents},
            {agent: spaces.Discrete(2) for agent in agents},
        )
        self.delay = delay
        self.cues: dict[AgentID, int] = {}

    def _observe(self, agent: AgentID) -> np.ndarray:
        obs = np.zeros(3, dtype=np.float32)
        if self.steps == 0:
            obs[self.cues[agent]] = 1.0
        obs[2] = float(self.steps == self.delay)
        return obs

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        self._reset_rng(seed)
        self.steps = 0
        self.agents = list(self.possible_agents)
        self.cues = {agent: int(self.rng.integers(2)) for agent in self.agents}
        return {agent: self._observe(agent) for agent in self.agents}, {agent: {} for agent in self.agents}

    def step(self, actions: dict[AgentID, Any]) -> tuple[dict, dict, dict, dict, dict]:
        self._check_actions(actions)
        asked = self.steps == self.delay
        rewards = {agent: float(asked and int(actions[agent]) == self.cues[agent]) for agent in self.agents}
        self.steps += 1
        observations = {agent: self._observe(agent) for agent in self.agents}
        terminations = dict.fromkeys(self.agents, asked)
        truncations = dict.fromkeys(self.agents, False)
        infos: dict[AgentID, dict] = {agent: {} for agent in self.agents}
        if asked:
            self.agents = []
        return observations, rewards, terminations, truncations, infos


class NoRenderModeEnv(DyingAgentsEnv):
    """A :class:`DyingAgentsEnv` without the ``render_mode`` attribute, as some hand-written ParallelEnvs are."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        del self.render_mode


class CrashingEnv(DyingAgentsEnv):
    """A :class:`DyingAgentsEnv` that fails at step ``crash_step``: it raises, or (``how="exit"``) kills its process."""

    metadata: ClassVar[dict[str, Any]] = {"name": "crashing_v0", "render_modes": [], "is_parallelizable": True}

    def __init__(self, crash_step: int = 2, how: str = "raise") -> None:
        super().__init__(death_steps={"agent_0": None, "agent_1": None}, max_steps=100)
        self.crash_step = crash_step
        self.how = how

    def step(self, actions: dict[AgentID, Any]) -> tuple[dict, dict, dict, dict, dict]:
        if self.steps + 1 == self.crash_step:
            if self.how == "exit":
                os._exit(3)
            raise RuntimeError(f"CrashingEnv crashed on purpose at step {self.crash_step}")
        return super().step(actions)


def _refuse_to_unpickle() -> None:
    raise ImportError("FactoryThatFailsInWorkers cannot be rebuilt in a worker process")


class FactoryThatFailsInWorkers:
    """An env factory that works here but cannot be unpickled in a worker, which then dies while starting up."""

    def __reduce__(self) -> tuple:
        return (_refuse_to_unpickle, ())

    def __call__(self) -> DyingAgentsEnv:
        return DyingAgentsEnv()


class CartPoleParallelEnv(ParallelEnv):
    """gymnasium's CartPole-v1 as a PettingZoo parallel env with one agent, ``agent_id``.

    Terminated when the pole falls, truncated by CartPole's time limit (500 steps, or ``max_episode_steps``).
    """

    metadata: ClassVar[dict[str, Any]] = {
        "name": "cartpole_parallel_v0",
        "render_modes": ["rgb_array"],
        "is_parallelizable": True,
    }

    def __init__(self, render_mode: str | None = None, max_episode_steps: int | None = None, agent_id: str = "cartpole"):
        self.env = gym.make("CartPole-v1", render_mode=render_mode, max_episode_steps=max_episode_steps)
        self.render_mode = render_mode
        self.possible_agents = [agent_id]
        self.agents: list[AgentID] = []
        self.observation_spaces = {agent_id: self.env.observation_space}
        self.action_spaces = {agent_id: self.env.action_space}

    def observation_space(self, agent: AgentID) -> spaces.Space:
        return self.observation_spaces[agent]

    def action_space(self, agent: AgentID) -> spaces.Space:
        return self.action_spaces[agent]

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        obs, info = self.env.reset(seed=seed, options=options)
        self.agents = list(self.possible_agents)
        agent = self.possible_agents[0]
        return {agent: obs}, {agent: info}

    def step(self, actions: dict[AgentID, Any]) -> tuple[dict, dict, dict, dict, dict]:
        agent = self.possible_agents[0]
        obs, reward, terminated, truncated, info = self.env.step(int(actions[agent]))
        if terminated or truncated:
            self.agents = []
        return {agent: obs}, {agent: float(reward)}, {agent: terminated}, {agent: truncated}, {agent: info}

    def render(self) -> Any:
        return self.env.render()

    def close(self) -> None:
        self.env.close()
