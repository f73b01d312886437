"""Natively batched envs: one env object that steps all its copies at once (VMAS, or any env that satisfies
:class:`BatchedParallelEnv`), as a :class:`~sb3_ippo.vec_env.base.MultiAgentVecEnv`.

Observations, actions, rewards and episode flags stay batched arrays (or tensors, converted once per agent and step)
from the env to the policies: stepping loops over agents, never over copies. Only what ends in a step is handled per
copy: the final observations of the agents that leave, the statistics of the episodes that end.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol, runtime_checkable

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from pettingzoo import AECEnv, ParallelEnv
from stable_baselines3.common.vec_env.base_vec_env import VecEnv, VecEnvIndices

from sb3_ippo.vec_env.base import AgentID, MultiAgentStep, MultiAgentVecEnv, ObsArray, copy_obs

# A batch of values, one row per copy: a numpy array, or anything numpy can read (a torch tensor, on any device).
Batch = Any


@runtime_checkable
class BatchedParallelEnv(Protocol):
    """What a natively batched multi-agent env provides: ``num_envs`` copies of a PettingZoo-like parallel env, stepped
    as one. Every batch has ``num_envs`` rows, one per copy, as numpy arrays or torch tensors (on any device).

    An env satisfies the protocol by having these members; no base class is needed. VMAS envs
    (``vmas.make_env(..., num_envs=N)``) are adapted by :class:`sb3_ippo.vec_env.vmas.VmasEnv`.

    Episodes: every possible agent is in every copy at reset. An agent leaves a copy at its termination or truncation;
    from then until the copy is reset, its rows are ignored (the actions it gets there are filler, which the env must
    accept and ignore). A copy's episode ends when every agent has left it; :class:`BatchedMultiAgentVecEnv` then calls
    ``reset_copies`` for the copies that ended (the env need not reset anything by itself).
    """

    #: The number of copies, the rows of every batch.
    num_envs: int
    #: Every agent id, in a fixed order.
    possible_agents: list[AgentID]

    def observation_space(self, agent: AgentID) -> spaces.Space:
        """The observation space of ``agent`` in one copy (a gymnasium space; a batch has ``num_envs`` of these)."""
        ...

    def action_space(self, agent: AgentID) -> spaces.Space:
        """The action space of ``agent`` in one copy (a gymnasium space)."""
        ...

    def reset(self, seed: int | None = None) -> Mapping[AgentID, Batch]:
        """Reset every copy; return ``{agent_id: observations (num_envs, *obs_shape)}``.

        ``seed``: seed copy ``i`` with ``seed + i``, as ``make_vec_env`` seeds PettingZoo copies, where the env can seed
        its copies apart (an env with one random stream for all, such as VMAS, seeds it with ``seed``). None: unseeded.
        """
        ...

    def reset_copies(self, mask: np.ndarray) -> Mapping[AgentID, Batch]:
        """Reset the copies where ``mask`` (bool, ``(num_envs,)``) is True, each continuing its own random stream;
        return the observations of all copies ``{agent_id: (num_envs, *obs_shape)}`` (the rows of the other copies as
        they were)."""
        ...

    def step(
        self, actions: Mapping[AgentID, np.ndarray]
    ) -> tuple[Mapping[AgentID, Batch], Mapping[AgentID, Batch], Mapping[AgentID, Batch], Mapping[AgentID, Batch], Any]:
        """Step every copy with ``{agent_id: actions (num_envs, *act_shape)}`` (numpy arrays; one entry per possible
        agent). Return ``(obs, rewards, terminations, truncations, infos)``: observations ``(num_envs, *obs_shape)``,
        rewards ``(num_envs,)`` and boolean flags ``(num_envs,)`` per agent, and the env's infos (anything; kept as
        ``BatchedMultiAgentVecEnv.last_infos``, not split per copy)."""
        ...


# The members of the protocol, for the message that says which ones an env lacks.
PROTOCOL_METHODS = ("observation_space", "action_space", "reset", "reset_copies", "step")
PROTOCOL_ATTRIBUTES = ("num_envs", "possible_agents")


def is_batched_env(env: Any) -> bool:
    """An env that steps many copies at once: a VMAS env, one with the protocol's own ``reset_copies``, or one with
    ``num_envs`` that is no other kind of env (a gymnasium or SB3 vectorized env is single-agent; a PettingZoo env is one
    copy). Such an env that lacks a member of the protocol is still one: :func:`as_batched_env` says what it lacks."""
    if isinstance(env, (type, MultiAgentVecEnv, VecEnv, gym.Env, gym.vector.VectorEnv, ParallelEnv, AECEnv)):
        return False
    return _is_vmas_env(env) or hasattr(env, "reset_copies") or hasattr(env, "num_envs")


def _is_vmas_env(env: Any) -> bool:
    return type(env).__module__.startswith("vmas.") and hasattr(env, "reset_at") and hasattr(env, "world")


def as_batched_env(env: Any) -> BatchedParallelEnv:
    """``env`` as a :class:`BatchedParallelEnv`: a VMAS env is adapted (:class:`sb3_ippo.vec_env.vmas.VmasEnv`), any
    other is checked.

    :raises TypeError: naming the members of the protocol that ``env`` lacks.
    """
    if _is_vmas_env(env):
        from sb3_ippo.vec_env.vmas import VmasEnv  # only where a VMAS env is given

        return VmasEnv(env)
    missing = [name for name in PROTOCOL_ATTRIBUTES if not hasattr(env, name)]
    missing += [name for name in PROTOCOL_METHODS if not callable(getattr(env, name, None))]
    if missing:
        raise TypeError(
            f"{type(env).__name__} is not a batched env: it lacks {', '.join(missing)}. A batched env has num_envs, "
            "possible_agents, observation_space(agent), action_space(agent), reset(seed=None), reset_copies(mask) and "
            "step(actions) (see sb3_ippo.vec_env.batched.BatchedParallelEnv), or is a VMAS env (vmas.make_env)."
        )
    num_envs = env.num_envs
    if not isinstance(num_envs, (int, np.integer)) or isinstance(num_envs, bool) or num_envs < 1:
        raise ValueError(f"{type(env).__name__}.num_envs must be a positive integer (the number of copies), got {num_envs!r}")
    return env


def to_numpy(batch: Batch) -> np.ndarray:
    """A batch as a numpy array: a torch tensor is detached and moved to the CPU (no copy for a CPU tensor)."""
    if hasattr(batch, "detach"):
        batch = batch.detach().cpu().numpy()
    return np.asarray(batch)


def filler_action(space: spaces.Space) -> np.ndarray:
    """A valid action of ``space``, given to an agent's rows where it is not alive (the env ignores them)."""
    if isinstance(space, spaces.Discrete):
        return np.asarray(space.start, dtype=np.int64)
    if isinstance(space, spaces.MultiDiscrete):
        return np.asarray(getattr(space, "start", np.zeros_like(space.nvec)), dtype=np.int64)
    if isinstance(space, spaces.MultiBinary):
        return np.zeros(space.shape, dtype=np.int8)
    if isinstance(space, spaces.Box):
        return np.clip(np.zeros(space.shape, dtype=space.dtype), space.low, space.high)
    raise TypeError(f"batched envs take Box, Discrete, MultiDiscrete or MultiBinary actions, got {space}")


class BatchedMultiAgentVecEnv(MultiAgentVecEnv):
    """The copies of a natively batched env (:class:`BatchedParallelEnv`, or a VMAS env) as a ``MultiAgentVecEnv``: what
    ``IPPO(policy, env)``, ``evaluate_policy`` and ``MultiAgentEvalCallback`` step when given such an env, and what
    ``make_vec_env(env_fn, n_envs, vec_env_cls="batched")`` makes from ``env_fn(num_envs=n_envs)``.

    The semantics are those of PettingZoo copies in ``make_vec_env``: per-agent arrays of ``num_envs`` rows, an alive
    mask (an agent leaves a copy at its termination or truncation; one that leaves without a termination is
    truncated), each copy reset at the end of its episode (``reset_copies`` of the copies that ended; ``obs`` then holds
    their first observations, ``final_obs`` the last ones), episode statistics in ``infos[i]["episode"]``, seeding
    (``seed(s)``: the next reset is ``reset(seed=s)``), ``max_episode_steps``. The env's infos are not split per copy:
    ``infos[i]`` is ``{"agents": {}}`` (plus the episode's statistics), and ``last_infos`` holds what the env returned.

    One env holds every copy, so a failure cannot be confined to one: an exception of the env propagates
    (``on_env_error="restart"`` is for PettingZoo copies). ``get_attr``, ``set_attr`` and ``env_method`` reach the one
    env: they act on every copy, and return its answer once per index asked for.

    :param env: The batched env.
    :param max_episode_steps: Truncate every copy's episode after this many steps (None: the env decides).
    """

    def __init__(self, env: Any, max_episode_steps: int | None = None) -> None:
        self.env = as_batched_env(env)
        n_envs = int(self.env.num_envs)
        agents = list(self.env.possible_agents)
        if not agents:
            raise ValueError(f"{type(env).__name__}.possible_agents is empty: a batched env needs at least one agent")
        observation_spaces = {agent: self.env.observation_space(agent) for agent in agents}
        action_spaces = {agent: self.env.action_space(agent) for agent in agents}
        for agent in agents:
            for kind, space in (("observation", observation_spaces[agent]), ("action", action_spaces[agent])):
                if not isinstance(space, spaces.Space):
                    raise TypeError(
                        f"{type(env).__name__}.{kind}_space({agent!r}) returned {space!r}: a gymnasium space of one copy "
                        "is expected (e.g. gymnasium.spaces.Box)"
                    )
        self._fillers = {agent: filler_action(space) for agent, space in action_spaces.items()}
        self._max_episode_steps = max_episode_steps
        self.last_infos: Any = None
        self._episode_lengths = np.zeros(n_envs, dtype=np.int64)
        self._team_returns = np.zeros(n_envs, dtype=np.float64)
        self._agent_returns = {agent: np.zeros(n_envs, dtype=np.float64) for agent in agents}
        self._episode_starts = np.full(n_envs, time.time())
        super().__init__(n_envs, agents, observation_spaces, action_spaces)

    # --- Checks of what the env returns -------------------------------------------------------------------------

    def _batch(self, values: Any, what: str, agent: AgentID, shape: tuple[int, ...], dtype: Any = None) -> np.ndarray:
        """``values`` (an array or tensor) as a numpy array of ``(num_envs, *shape)``, or a clear error."""
        array = to_numpy(values)
        expected = (self.num_envs, *shape)
        if array.shape != expected:
            if array.size == int(np.prod(expected)) and array.shape[:1] == (self.num_envs,):
                array = array.reshape(expected)  # e.g. VMAS's (num_envs, 1) discrete actions or flags
            else:
                raise ValueError(
                    f"The batched env {type(self.env).__name__} returned {what} of shape {array.shape} for agent "
                    f"{agent!r}; expected {expected} (one row per copy, num_envs={self.num_envs})"
                )
        return array if dtype is None else array.astype(dtype, copy=False)

    def _per_agent(self, values: Any, what: str) -> Mapping[AgentID, Any]:
        if not isinstance(values, Mapping):
            raise TypeError(
                f"The batched env {type(self.env).__name__} returned {what} as {type(values).__name__}; expected a "
                f"dict {{agent_id: batch of num_envs rows}} with the agents {self.possible_agents}"
            )
        missing = [agent for agent in self.possible_agents if agent not in values]
        if missing:
            raise ValueError(
                f"The batched env {type(self.env).__name__} returned no {what} for the agents {missing}; expected one "
                f"batch for every possible agent {self.possible_agents}"
            )
        return values

    def _observations(self, obs: Any) -> dict[AgentID, ObsArray]:
        obs = self._per_agent(obs, "observations")
        return {agent: self._observation(obs[agent], agent, self.observation_spaces[agent]) for agent in self.possible_agents}

    def _observation(self, values: Any, agent: AgentID, space: spaces.Space) -> ObsArray:
        if isinstance(space, spaces.Dict):
            return {key: self._observation(values[key], agent, sub) for key, sub in space.spaces.items()}  # type: ignore[misc]
        return self._batch(values, "observations", agent, space.shape or (), space.dtype)

    # --- Reset and step ---------------------------------------------------------------------------------------

    def reset(self) -> dict[AgentID, ObsArray]:  # type: ignore[override]
        """Reset every copy (with ``seed`` if ``seed(seed)`` was called); return ``{agent_id: obs (n_envs, ...)}``."""
        obs = self._observations(self.env.reset(seed=self._seeds[0]))
        self._reset_seeds()
        self._reset_options()
        everyone = np.ones(self.num_envs, dtype=bool)
        self._start_episodes(everyone)
        self.reset_infos = [{"agents": {}} for _ in range(self.num_envs)]
        self._obs = obs
        return {agent: copy_obs(agent_obs) for agent, agent_obs in obs.items()}

    def _start_episodes(self, mask: np.ndarray) -> None:
        for agent in self.possible_agents:
            self._alive[agent][mask] = True
            self._agent_returns[agent][mask] = 0.0
        self._episode_lengths[mask] = 0
        self._team_returns[mask] = 0.0
        self._episode_starts[mask] = time.time()

    def _env_actions(self, actions: Mapping[AgentID, np.ndarray]) -> dict[AgentID, np.ndarray]:
        """Every agent's actions, ``(num_envs, *act_shape)``, with filler in the rows where it is not alive."""
        unknown = set(actions) - set(self.possible_agents)
        if unknown:
            raise KeyError(f"Actions for unknown agents {sorted(unknown)}; the env's agents are {self.possible_agents}")
        env_actions = {}
        for agent in self.possible_agents:
            filler = self._fillers[agent]
            if agent not in actions:
                env_actions[agent] = np.broadcast_to(filler, (self.num_envs, *filler.shape)).copy()
                continue
            agent_actions = np.asarray(actions[agent])
            if agent_actions.shape[:1] != (self.num_envs,) or agent_actions.size != self.num_envs * filler.size:
                raise ValueError(
                    f"Actions for agent {agent!r} have shape {agent_actions.shape}; expected {(self.num_envs, *filler.shape)} "
                    f"(one row per env copy, each an action of {self.action_spaces[agent]})"
                )
            agent_actions = agent_actions.reshape(self.num_envs, *filler.shape)
            alive = self._alive[agent].reshape(-1, *([1] * filler.ndim))
            env_actions[agent] = np.where(alive, agent_actions, filler).astype(filler.dtype, copy=False)
        return env_actions

    def _wait_agents(self) -> MultiAgentStep:
        assert self._actions is not None, "step_async must be called before step_agents or step_wait"
        env_actions = self._env_actions(self._actions)
        self._actions = None
        result = self.env.step(env_actions)
        if not isinstance(result, tuple) or len(result) != 5:
            raise TypeError(
                f"The batched env {type(self.env).__name__}.step returned {type(result).__name__}"
                f"{f' of {len(result)} items' if isinstance(result, tuple) else ''}; expected the tuple "
                "(obs, rewards, terminations, truncations, infos), each but infos a dict {agent_id: batch}"
            )
        env_obs, env_rewards, env_terminations, env_truncations, self.last_infos = result
        obs = self._observations(env_obs)
        env_rewards = self._per_agent(env_rewards, "rewards")
        env_terminations = self._per_agent(env_terminations, "terminations")
        env_truncations = self._per_agent(env_truncations, "truncations")

        self._episode_lengths += 1
        time_limit = (
            np.zeros(self.num_envs, dtype=bool)
            if self._max_episode_steps is None
            else self._episode_lengths >= self._max_episode_steps
        )
        rewards, terminations, truncations = {}, {}, {}
        step_team_rewards = np.zeros(self.num_envs, dtype=np.float64)
        final_obs: dict[AgentID, dict[int, Any]] = {}
        still_alive = np.zeros(self.num_envs, dtype=bool)
        for agent in self.possible_agents:
            acting = self._alive[agent]
            reward = np.where(acting, self._batch(env_rewards[agent], "rewards", agent, (), np.float32), 0).astype(np.float32)
            terminated = acting & self._batch(env_terminations[agent], "terminations", agent, (), bool)
            # An agent that leaves without a termination (the env's truncation, or the time limit) is truncated.
            truncated = (
                acting & ~terminated & (self._batch(env_truncations[agent], "truncations", agent, (), bool) | time_limit)
            )
            rewards[agent], terminations[agent], truncations[agent] = reward, terminated, truncated
            step_team_rewards += reward  # agent by agent, in order, as a PettingZoo copy sums its team's rewards
            self._agent_returns[agent] += reward
            leaving = np.flatnonzero(terminated | truncated)
            final_obs[agent] = {i: _row(obs[agent], i) for i in leaving.tolist()}
            self._alive[agent] = acting & ~(terminated | truncated)
            still_alive |= self._alive[agent]
        self._team_returns += step_team_rewards
        dones = ~still_alive
        infos: list[dict[str, Any]] = [{"agents": {}} for _ in range(self.num_envs)]
        if dones.any():
            for env_idx in np.flatnonzero(dones).tolist():
                infos[env_idx]["episode"] = {
                    "r": float(self._team_returns[env_idx]),
                    "l": int(self._episode_lengths[env_idx]),
                    "t": round(time.time() - float(self._episode_starts[env_idx]), 6),
                    "agent_returns": {agent: float(self._agent_returns[agent][env_idx]) for agent in self.possible_agents},
                }
            obs = self._observations(self.env.reset_copies(dones.copy()))
            self._start_episodes(dones)
        # An agent's row keeps its last observation while it is not alive, as in PettingZoo copies.
        self._obs = obs = {agent: _where(self._alive[agent], obs[agent], self._obs[agent]) for agent in self.possible_agents}
        return MultiAgentStep(
            obs={agent: copy_obs(agent_obs) for agent, agent_obs in obs.items()},
            rewards=rewards,
            terminations=terminations,
            truncations=truncations,
            alive=self.alive,
            dones=dones,
            infos=infos,
            final_obs=final_obs,
            restarted=np.zeros(self.num_envs, dtype=bool),
        )

    def _set_max_episode_steps(self, value: int | None) -> None:
        pass  # read at every step

    # --- The one env behind every copy --------------------------------------------------------------------------

    def close(self) -> None:
        close = getattr(self.env, "close", None)
        if callable(close):
            close()

    def get_attr(self, attr_name: str, indices: VecEnvIndices = None) -> list[Any]:
        if attr_name == "render_mode" and not hasattr(self.env, "render_mode"):
            value = None  # SB3's VecEnv asks; a batched env without one does not render
        else:
            value = getattr(self.env, attr_name)
        return [value for _ in self._get_indices(indices)]

    def set_attr(self, attr_name: str, value: Any, indices: VecEnvIndices = None) -> None:
        setattr(self.env, attr_name, value)

    def env_method(self, method_name: str, *method_args, indices: VecEnvIndices = None, **method_kwargs) -> list[Any]:
        result = getattr(self.env, method_name)(*method_args, **method_kwargs)
        return [result for _ in self._get_indices(indices)]


def _where(mask: np.ndarray, new: ObsArray, old: ObsArray) -> ObsArray:
    """``new``'s rows where ``mask``, ``old``'s elsewhere."""
    if isinstance(new, dict):
        assert isinstance(old, dict)
        return {key: _where(mask, value, old[key]) for key, value in new.items()}  # type: ignore[misc]
    assert not isinstance(old, dict)
    return np.where(mask.reshape(-1, *([1] * (new.ndim - 1))), new, old)


def _row(obs: ObsArray, env_idx: int) -> Any:
    """Copy ``env_idx``'s observation, copied out of the batch (the batch is replaced at the copy's reset)."""
    if isinstance(obs, dict):
        return {key: np.array(value[env_idx]) for key, value in obs.items()}
    return np.array(obs[env_idx])


def make_batched_vec_env(
    env_fn: Callable[..., Any],
    n_envs: int,
    seed: int | None = None,
    env_kwargs: dict[str, Any] | None = None,
    critic_input: Any = None,
) -> BatchedMultiAgentVecEnv:
    """``make_vec_env(env_fn, n_envs, vec_env_cls="batched")``: one env of ``n_envs`` copies,
    ``env_fn(num_envs=n_envs, **env_kwargs)`` (e.g. ``vmas.make_env`` with ``env_kwargs={"scenario": "balance"}``).

    :raises ValueError: for a ``critic_input`` (MAPPO's critic input is added by a wrapper of PettingZoo copies).
    """
    if critic_input is not None:
        raise ValueError('critic_input (MAPPO) is not supported with vec_env_cls="batched": use PettingZoo copies')
    env = env_fn(num_envs=n_envs, **(env_kwargs or {}))
    if not is_batched_env(env):
        raise TypeError(
            f'vec_env_cls="batched" needs env_fn(num_envs=n_envs) to return a batched env (one that steps its copies '
            f"at once: a VMAS env, or see sb3_ippo.vec_env.batched.BatchedParallelEnv); {env_fn!r} returned "
            f"{type(env).__name__}. For PettingZoo envs, use vec_env_cls='dummy' or 'subproc'."
        )
    vec_env = BatchedMultiAgentVecEnv(env)
    if vec_env.num_envs != n_envs:
        raise ValueError(f"env_fn(num_envs={n_envs}) returned an env of {vec_env.num_envs} copies")
    if seed is not None:
        vec_env.seed(seed)
    return vec_env
