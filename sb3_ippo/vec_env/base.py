"""The multi-agent vectorized environment: ``n_envs`` copies of a PettingZoo parallel env, as per-agent arrays.

Every array the layer hands out is keyed by agent id and has ``n_envs`` rows, one per env copy. An agent that
is not alive in a copy (it left the episode, or the env did not spawn it) has its row masked out by ``alive``:
it gets no action and produces no transition until that copy starts a new episode. :class:`MultiAgentVecEnv` is the
base of every kind of copy (``dummy``, ``subproc``, ``ray``, ``turn_based``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from stable_baselines3.common.monitor import Monitor
from stable_baselines3.common.vec_env.base_vec_env import VecEnv, VecEnvIndices, VecEnvStepReturn

from sb3_ippo.common.type_aliases import AgentID, ObsArray
from sb3_ippo.vec_env.copies import CopyFailure, CopyStep, Rebuilt, Resolved, lost_episode



class MultiAgentStep(NamedTuple):
    """What one vectorized step returns (``MultiAgentVecEnv.step_agents``). Every per-agent array has ``n_envs`` rows.

    ``rewards``, ``terminations`` and ``truncations`` are meaningful only where the agent acted in this step
    (zero/False elsewhere). ``final_obs[agent][env_idx]`` is the observation an agent's trajectory ended on in
    this step (terminated, truncated, or left the env), which ``obs`` no longer holds once a copy has reset.
    ``dones[env_idx]`` says that copy's episode ended and the copy was reset: ``obs`` and ``alive`` then
    describe the first step of its next episode, and ``infos[env_idx]["episode"]`` holds its statistics.

    ``restarted[env_idx]`` says that copy's env failed in this step (with ``on_env_error="restart"``) and was
    rebuilt and reset: its episode in progress is lost, its rewards and flags in this step are not transitions,
    and ``dones[env_idx]`` is True without an ``"episode"`` entry. ``infos[env_idx]["env_restarted"]`` is True for
    every restart (also for an env that failed to reset after a finished episode, which loses nothing), with the
    failure's traceback in ``infos[env_idx]["env_error"]``. None where the env layer does not restart copies.
    """

    obs: dict[AgentID, ObsArray]
    rewards: dict[AgentID, np.ndarray]
    terminations: dict[AgentID, np.ndarray]
    truncations: dict[AgentID, np.ndarray]
    alive: dict[AgentID, np.ndarray]
    dones: np.ndarray
    infos: list[dict[str, Any]]
    final_obs: dict[AgentID, dict[int, Any]]
    restarted: np.ndarray | None = None

    @property
    def team_rewards(self) -> np.ndarray:
        """``(n_envs,)``: the sum of the agents' rewards in each copy."""
        return np.sum(list(self.rewards.values()), axis=0, dtype=np.float32).reshape(-1)


def _allocate(space: spaces.Space, n_envs: int) -> ObsArray:
    """Zeroed storage for ``n_envs`` values of ``space``."""
    if isinstance(space, spaces.Dict):
        return {key: _allocate(sub, n_envs) for key, sub in space.spaces.items()}  # type: ignore[misc]
    return np.zeros((n_envs, *(space.shape or ())), dtype=space.dtype)


def _write(storage: ObsArray, env_idx: int, value: Any) -> None:
    if isinstance(storage, dict):
        for key, sub in storage.items():
            sub[env_idx] = value[key]
    else:
        storage[env_idx] = value


def copy_obs(obs: ObsArray) -> ObsArray:
    if isinstance(obs, dict):
        return {key: value.copy() for key, value in obs.items()}
    return obs.copy()


ENV_ERROR_POLICIES = ("raise", "restart")
DEFAULT_MAX_RESTARTS = 100


def check_env_error_policy(on_env_error: str, max_restarts: int) -> None:
    if on_env_error not in ENV_ERROR_POLICIES:
        raise ValueError(f"on_env_error must be one of {ENV_ERROR_POLICIES}, got {on_env_error!r}")
    if not isinstance(max_restarts, (int, np.integer)) or isinstance(max_restarts, bool) or max_restarts < 0:
        raise ValueError(f"max_restarts must be a non-negative integer (the restarts allowed in all), got {max_restarts!r}")


class MultiAgentVecEnv(VecEnv):
    """``n_envs`` copies of a PettingZoo parallel env, stepped together, with per-agent arrays of ``n_envs`` rows.

    ``observation_space`` and ``action_space`` are ``spaces.Dict`` keyed by agent id (SB3's ``VecEnv`` needs
    one space each); ``observation_spaces[agent]`` and ``action_spaces[agent]`` are the agents' own spaces.
    ``step`` takes ``{agent_id: actions of shape (n_envs, *act_shape)}`` and returns a :class:`MultiAgentStep`.

    An env copy that raises in ``step`` or ``reset`` (or, with worker processes, whose worker dies) is handled by
    ``on_env_error``: "raise" raises a ``RuntimeError`` that carries the env's traceback; "restart" rebuilds the
    copy from its env factory, resets it with a new seed (``seed + i + k * n_envs`` for the ``k``-th restart of
    copy ``i``, when the env was seeded) and goes on: the step reports that copy as restarted
    (:class:`MultiAgentStep`), and only its episode in progress is lost. ``restarts`` counts the copies rebuilt;
    one more failure than ``max_restarts`` raises. A rebuilt copy is a fresh ``env_fn()``: attributes changed with
    ``set_attr`` are not carried over.

    ``max_episode_steps`` (an attribute, settable): truncate every copy's episode after this many steps (None: the env
    decides).
    """

    possible_agents: list[AgentID]
    observation_spaces: dict[AgentID, spaces.Space]
    action_spaces: dict[AgentID, spaces.Space]
    # MAPPO's critic input that every copy adds to its observations (sb3_ippo.common.critic_input.CriticInput), or None.
    critic_input: Any = None

    def __init__(
        self,
        num_envs: int,
        possible_agents: Sequence[AgentID],
        observation_spaces: dict[AgentID, spaces.Space],
        action_spaces: dict[AgentID, spaces.Space],
        on_env_error: str = "raise",
        max_restarts: int = DEFAULT_MAX_RESTARTS,
    ) -> None:
        check_env_error_policy(on_env_error, max_restarts)
        self.possible_agents = list(possible_agents)
        self.observation_spaces = observation_spaces
        self.action_spaces = action_spaces
        self._obs = {agent: _allocate(space, num_envs) for agent, space in observation_spaces.items()}
        self._alive = {agent: np.zeros(num_envs, dtype=bool) for agent in self.possible_agents}
        self._actions: dict[AgentID, np.ndarray] | None = None
        self.on_env_error = on_env_error
        self.max_restarts = max_restarts
        self.restarts = 0
        self._copy_restarts = [0] * num_envs
        self._base_seed: int | None = None
        super().__init__(num_envs, spaces.Dict(observation_spaces), spaces.Dict(action_spaces))
        if self.render_mode is not None:
            # SB3's VecVideoRecorder reads the frame rate here.
            self.metadata["render_fps"] = (self.get_attr("metadata", [0])[0] or {}).get("render_fps", 30)

    def seed(self, seed: int | None = None) -> Sequence[int | None]:
        """Seed copy ``i`` with ``seed + i`` at its next reset (a random ``seed`` if None), as SB3's ``VecEnv`` does."""
        seeds = super().seed(seed)
        self._base_seed = self._seeds[0]
        return seeds

    # --- Env failures -----------------------------------------------------------------------------------------

    def _rebuild(self, env_idx: int, seed: int | None) -> tuple[dict, dict, dict] | CopyFailure:
        """Replace copy ``env_idx`` by a new env from its factory, reset with ``seed``: ``(obs, infos, alive)``."""
        raise NotImplementedError

    def _env_error(self, message: str, failure: CopyFailure | str) -> None:
        """Raise the error that ends the run (subclasses clean up first)."""
        cause = failure.error if isinstance(failure, CopyFailure) else None
        raise RuntimeError(f"{type(self).__name__}: {message}") from cause

    def _count_restart(self, env_idx: int, failure: CopyFailure | str) -> None:
        """Count one restart of copy ``env_idx``, or raise: with ``on_env_error="raise"``, or past ``max_restarts``."""
        reason = failure if isinstance(failure, str) else f"raised in {failure.phase}:\n{failure.traceback}"
        if self.on_env_error == "raise":
            self._env_error(
                f"env copy {env_idx} {reason}\n(With make_vec_env(..., on_env_error='restart'), a failed copy is rebuilt "
                "and collection goes on.)",
                failure,
            )
        if self.restarts >= self.max_restarts:
            self._env_error(
                f"env copy {env_idx} {reason}\nThe env copies have been restarted {self.restarts} times already, the "
                f"most max_restarts={self.max_restarts} allows: raise max_restarts, or fix the env.",
                failure,
            )
        self.restarts += 1
        self._copy_restarts[env_idx] += 1

    def _restart_seed(self, env_idx: int) -> int | None:
        if self._base_seed is None:
            return None
        return self._base_seed + env_idx + self.num_envs * self._copy_restarts[env_idx]

    def _restart_copy(self, env_idx: int, failure: CopyFailure) -> Rebuilt:
        """Rebuild a failed copy (again, while the rebuild itself fails) and reset it; raise past ``max_restarts``."""
        first = failure
        while True:
            self._count_restart(env_idx, failure)
            outcome = self._rebuild(env_idx, self._restart_seed(env_idx))
            if not isinstance(outcome, CopyFailure):
                obs, infos, alive = outcome
                return Rebuilt(obs, infos, alive, f"env copy {env_idx} raised in {first.phase}:\n{first.traceback}")
            failure = outcome

    def _resolve_step(self, env_idx: int, result: CopyStep | CopyFailure) -> Resolved:
        """A copy's step result, with a failed copy restarted (or the error raised)."""
        if not isinstance(result, CopyFailure):
            return Resolved(result, None, False)
        rebuilt = self._restart_copy(env_idx, result)
        if result.phase == "reset" and result.step_result is not None:
            # The episode had ended: only the next one's reset failed. Nothing is lost.
            return Resolved(result.step_result._replace(obs=rebuilt.obs, alive=rebuilt.alive), rebuilt.error, False)
        return lost_episode(rebuilt)

    def _resolve_reset(self, env_idx: int, result: tuple[dict, dict, dict] | CopyFailure) -> tuple[dict, dict, str | None]:
        """A copy's reset result ``(obs, infos, restart error or None)``, with a failed copy restarted."""
        if not isinstance(result, CopyFailure):
            obs, infos, _ = result
            return obs, infos, None
        rebuilt = self._restart_copy(env_idx, result)
        return rebuilt.obs, rebuilt.infos, rebuilt.error

    def observation_space_of(self, agent: AgentID) -> spaces.Space:
        return self.observation_spaces[agent]

    def action_space_of(self, agent: AgentID) -> spaces.Space:
        return self.action_spaces[agent]

    @property
    def alive(self) -> dict[AgentID, np.ndarray]:
        """Which agents act in each copy at the next step: ``{agent_id: bool array (n_envs,)}``."""
        return {agent: mask.copy() for agent, mask in self._alive.items()}

    @property
    def max_episode_steps(self) -> int | None:
        return self._max_episode_steps

    @max_episode_steps.setter
    def max_episode_steps(self, value: int | None) -> None:
        if value is not None and value < 1:
            raise ValueError(f"max_episode_steps must be a positive number of steps or None, got {value}")
        self._max_episode_steps = value
        self._set_max_episode_steps(value)

    def _set_max_episode_steps(self, value: int | None) -> None:
        raise NotImplementedError

    def _collect_reset(self, results: Sequence[tuple[dict, dict, str | None]]) -> dict[AgentID, ObsArray]:
        for env_idx, (obs, infos, restart_error) in enumerate(results):
            self.reset_infos[env_idx] = {"agents": infos}
            if restart_error is not None:
                self.reset_infos[env_idx].update(env_restarted=True, env_error=restart_error)
            for agent in self.possible_agents:
                alive = agent in obs
                self._alive[agent][env_idx] = alive
                if alive:
                    _write(self._obs[agent], env_idx, obs[agent])
        self._reset_seeds()
        self._reset_options()
        return {agent: copy_obs(obs) for agent, obs in self._obs.items()}

    def _collect_step(self, results: Sequence[Resolved]) -> MultiAgentStep:
        n_envs = self.num_envs
        rewards = {agent: np.zeros(n_envs, dtype=np.float32) for agent in self.possible_agents}
        terminations = {agent: np.zeros(n_envs, dtype=bool) for agent in self.possible_agents}
        truncations = {agent: np.zeros(n_envs, dtype=bool) for agent in self.possible_agents}
        final_obs: dict[AgentID, dict[int, Any]] = {agent: {} for agent in self.possible_agents}
        dones = np.zeros(n_envs, dtype=bool)
        restarted = np.zeros(n_envs, dtype=bool)
        infos: list[dict[str, Any]] = []
        for env_idx, (result, restart_error, episode_lost) in enumerate(results):
            obs, step_rewards, step_terms, step_truncs, step_infos, alive, done, ends, episode = result
            for agent, reward in step_rewards.items():
                rewards[agent][env_idx] = reward
                terminations[agent][env_idx] = step_terms[agent]
                truncations[agent][env_idx] = step_truncs[agent]
            for agent, observation in ends.items():
                final_obs[agent][env_idx] = observation
            for agent in self.possible_agents:
                self._alive[agent][env_idx] = agent in alive
                if agent in obs and (done or agent in alive):
                    _write(self._obs[agent], env_idx, obs[agent])
            info: dict[str, Any] = {"agents": step_infos}
            dones[env_idx] = done
            if episode is not None:
                info["episode"] = episode
            if restart_error is not None:
                info.update(env_restarted=True, env_error=restart_error)
                restarted[env_idx] = episode_lost
            infos.append(info)
        return MultiAgentStep(
            obs={agent: copy_obs(obs) for agent, obs in self._obs.items()},
            rewards=rewards,
            terminations=terminations,
            truncations=truncations,
            alive=self.alive,
            dones=dones,
            infos=infos,
            final_obs=final_obs,
            restarted=restarted,
        )

    def _split_actions(self, actions: dict[AgentID, np.ndarray]) -> list[dict[AgentID, Any]]:
        unknown = set(actions) - set(self.possible_agents)
        if unknown:
            raise KeyError(f"Actions for unknown agents {sorted(unknown)}; the env's agents are {self.possible_agents}")
        per_copy: list[dict[AgentID, Any]] = [{} for _ in range(self.num_envs)]
        for agent, agent_actions in actions.items():
            agent_actions = np.asarray(agent_actions)
            if len(agent_actions) != self.num_envs:
                raise ValueError(
                    f"Actions for agent {agent!r} have {len(agent_actions)} rows; expected one per env copy ({self.num_envs})"
                )
            discrete = isinstance(self.action_spaces[agent], spaces.Discrete)
            for env_idx in np.flatnonzero(self._alive[agent]):
                per_copy[env_idx][agent] = int(agent_actions[env_idx]) if discrete else agent_actions[env_idx]
        return per_copy

    def step_agents(self, actions: dict[AgentID, np.ndarray]) -> MultiAgentStep:
        """Step every copy with ``{agent_id: actions (n_envs, *act_shape)}``, with the per-agent detail.

        Rows of agents that are not alive are ignored. ``step(actions)`` does the same step and returns SB3's
        ``(obs, team_rewards, dones, infos)`` instead.
        """
        self.step_async(actions)
        return self._wait_agents()

    def step_async(self, actions: dict[AgentID, np.ndarray]) -> None:  # type: ignore[override]
        self._actions = actions

    def step_wait(self) -> VecEnvStepReturn:
        """SB3's step result: ``(obs, team_rewards, dones, infos)``; ``team_rewards[i]`` sums copy i's agents' rewards."""
        step = self._wait_agents()
        return step.obs, step.team_rewards, step.dones, step.infos  # type: ignore[return-value]

    def _wait_agents(self) -> MultiAgentStep:
        raise NotImplementedError

    def reset(self) -> dict[AgentID, ObsArray]:  # type: ignore[override]
        """Reset every copy (copy i with seed + i if ``seed(seed)`` was called); return ``{agent_id: obs (n_envs, ...)}``."""
        raise NotImplementedError

    def get_images(self) -> Sequence[np.ndarray | None]:
        """Each copy's frame (``render()`` of a copy made with ``render_mode="rgb_array"``). ``render()``, SB3's,
        tiles them into one image, so SB3's ``VecVideoRecorder`` records every copy."""
        if self.render_mode != "rgb_array":
            raise ValueError(
                f"The env copies were made with render_mode={self.render_mode!r}: images need render_mode='rgb_array', "
                "e.g. make_vec_env(env_fn, env_kwargs=dict(render_mode='rgb_array'))"
            )
        return self.env_method("render")

    def env_is_wrapped(self, wrapper_class: type[gym.Wrapper], indices: VecEnvIndices = None) -> list[bool]:
        # PettingZoo envs are not gymnasium envs: no gymnasium wrapper can be around them. But every copy records
        # Monitor-style episode statistics (team return), which is what SB3's evaluation asks Monitor for.
        return [wrapper_class is Monitor for _ in self._get_indices(indices)]

    def _get_indices(self, indices: VecEnvIndices) -> list[int]:
        if indices is None:
            return list(range(self.num_envs))
        if isinstance(indices, int):
            return [indices]
        return list(indices)
