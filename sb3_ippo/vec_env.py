"""The multi-agent vectorized environment: ``n_envs`` copies of a PettingZoo parallel env, as per-agent arrays.

Every array the layer hands out is keyed by agent id and has ``n_envs`` rows, one per env copy. An agent that
is not alive in a copy (it left the episode, or the env did not spawn it) has its row masked out by ``alive``:
it gets no action and produces no transition until that copy starts a new episode.
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from pettingzoo import AECEnv, ParallelEnv
from pettingzoo.utils.conversions import aec_to_parallel
from stable_baselines3.common.monitor import Monitor
from stable_baselines3.common.vec_env import VecNormalize
from stable_baselines3.common.vec_env.base_vec_env import VecEnv, VecEnvIndices, VecEnvStepReturn

AgentID = str
ObsArray = np.ndarray | dict[str, np.ndarray]


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


def is_parallel_env(env: Any) -> bool:
    """A PettingZoo ``ParallelEnv``, or an object with its interface (some wrappers do not subclass it)."""
    if isinstance(env, ParallelEnv):
        return True
    if isinstance(env, (AECEnv, gym.Env, VecEnv)):
        return False
    return all(hasattr(env, name) for name in ("possible_agents", "reset", "step")) and callable(
        getattr(env, "observation_space", None)
    )


def to_parallel_env(env: Any) -> ParallelEnv:
    """Return ``env`` as a PettingZoo ``ParallelEnv``, converting an AEC env where the env allows it.

    :raises ValueError: for an AEC env that PettingZoo cannot run in parallel.
    :raises TypeError: for anything that is not a PettingZoo env.
    """
    if is_parallel_env(env):
        return env
    if isinstance(env, AECEnv):
        if not env.metadata.get("is_parallelizable", False):
            # PettingZoo's own advice (set is_parallelizable) is wrong for a game whose agents take turns.
            name = env.metadata.get("name", type(env.unwrapped).__name__)
            raise ValueError(
                f"The AEC environment {name} is turn-based (its metadata does not set is_parallelizable), so it "
                "cannot be converted to a parallel environment. make_vec_env(env_fn) and IPPO(policy, env) step such envs "
                "turn by turn (sb3_ippo.turn_based)."
            )
        return aec_to_parallel(env)
    if isinstance(env, str):
        raise TypeError(
            f"Got the string {env!r}; sb3_ippo needs a PettingZoo environment instance, "
            "e.g. `simple_spread_v3.parallel_env()` from mpe2, or `make_vec_env(simple_spread_v3.parallel_env, n_envs=4)`."
        )
    if isinstance(env, gym.Env):
        raise TypeError(
            f"Got the gymnasium env {env}; sb3_ippo trains PettingZoo multi-agent environments (ParallelEnv or AECEnv). "
            "For a single-agent gymnasium env, use stable_baselines3.PPO."
        )
    if callable(env):
        kind = "class" if isinstance(env, type) else "function"
        name = getattr(env, "__qualname__", "")
        label = f"the {kind} {name}" if name and "<" not in name else f"a {kind}"  # not "<locals>.par_fn"
        raise TypeError(
            f"Got {label}, not an environment: call it to make one, e.g. "
            "`IPPO('MlpPolicy', simple_spread_v3.parallel_env())`, or pass the function to make_vec_env, e.g. "
            "`make_vec_env(simple_spread_v3.parallel_env, n_envs=8)`."
        )
    raise TypeError(f"Expected a PettingZoo ParallelEnv or AECEnv, got {type(env).__name__}: {env!r}")


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


class _EpisodeCopy:
    """One copy of the parallel env: it tracks alive agents and episode statistics, and resets itself at episode end."""

    def __init__(self, env: ParallelEnv, max_episode_steps: int | None = None) -> None:
        self.env = env
        self.max_episode_steps = max_episode_steps
        # Ordered like env.agents (a dict, not a set), so that sums over agents, such as the team return, do not
        # depend on the process's string hashing: the same seed gives the same data in every worker process.
        self.alive: dict[AgentID, None] = {}
        # Agents that left the current episode: they are never revived before the next reset.
        self.finished: set[AgentID] = set()
        self.episode_length = 0
        self.team_return = 0.0
        self.agent_returns: dict[AgentID, float] = {}
        self.episode_start = time.time()

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        obs, infos = self.env.reset(seed=seed, options=options or None)
        self.alive = dict.fromkeys(agent for agent in self.env.agents if agent in obs)
        self.finished = set()
        self.episode_length = 0
        self.team_return = 0.0
        self.agent_returns = {agent: 0.0 for agent in self.env.possible_agents}
        self.episode_start = time.time()
        return obs, infos

    def step(self, actions: dict[AgentID, Any]) -> _CopyStep:
        """Step the alive agents. When no agent is left the episode is done, and the caller resets the copy
        (:func:`_step_copy`)."""
        acting = self.alive
        obs, rewards, terminations, truncations, infos = self.env.step(
            {agent: action for agent, action in actions.items() if agent in acting}
        )
        self.episode_length += 1
        time_limit = self.max_episode_steps is not None and self.episode_length >= self.max_episode_steps
        terminations = {agent: bool(terminations.get(agent, False)) for agent in acting}
        truncations = {agent: bool(truncations.get(agent, False)) for agent in acting}
        new_alive: dict[AgentID, None] = {}
        if not time_limit:
            new_alive = dict.fromkeys(
                agent
                for agent in self.env.agents
                if agent in obs and agent not in self.finished and not terminations.get(agent) and not truncations.get(agent)
            )
        leaving = [agent for agent in acting if agent not in new_alive]
        for agent in leaving:
            # An agent that leaves without a termination flag (time limit, or dropped by the env) is truncated:
            # its trajectory did not reach a terminal state.
            if not terminations[agent]:
                truncations[agent] = True
        self.finished.update(leaving)
        self.alive = new_alive
        rewards = {agent: float(rewards.get(agent, 0.0)) for agent in acting}
        for agent, reward in rewards.items():
            self.agent_returns[agent] += reward
        self.team_return += sum(rewards.values())
        final_obs = {agent: obs.get(agent) for agent in leaving}
        done = not self.alive
        episode = None
        if done:
            episode = {
                "r": self.team_return,
                "l": self.episode_length,
                "t": round(time.time() - self.episode_start, 6),
                "agent_returns": dict(self.agent_returns),
            }
        return _CopyStep(obs, rewards, terminations, truncations, infos, self.alive, done, final_obs, episode)


class _CopyStep(NamedTuple):
    """One copy's step: obs, rewards, terminations, truncations, infos, alive agents, whether the episode is done
    (then ``obs`` and ``alive`` are those of the next episode's reset), final obs of the agents that left, episode
    statistics."""

    obs: dict
    rewards: dict
    terminations: dict
    truncations: dict
    infos: dict
    alive: dict
    done: bool
    final_obs: dict
    episode: dict | None


class CopyFailure(NamedTuple):
    """An env copy that raised. ``phase``: "step", "reset" (the reset after a finished step, whose result is kept
    in ``step_result``), or "restart" (the rebuild of a failed copy). ``error`` is the exception itself in this
    process, None when it comes from a worker process (only its traceback text travels)."""

    phase: str
    traceback: str
    step_result: _CopyStep | None = None
    error: BaseException | None = None


def _step_copy(episode_copy: _EpisodeCopy, actions: dict[AgentID, Any], keep_error: bool) -> _CopyStep | CopyFailure:
    """Step one copy and reset it at the end of its episode; an exception of the env becomes a :class:`CopyFailure`."""
    try:
        result = episode_copy.step(actions)
    except Exception as error:
        return CopyFailure("step", traceback.format_exc(), None, error if keep_error else None)
    if result.done:
        try:
            obs, _ = episode_copy.reset()
        except Exception as error:
            return CopyFailure("reset", traceback.format_exc(), result, error if keep_error else None)
        result = result._replace(obs=obs, alive=episode_copy.alive)
    return result


def _reset_copy(
    episode_copy: _EpisodeCopy, seed: int | None, options: dict | None, keep_error: bool
) -> tuple[dict, dict, dict] | CopyFailure:
    """Reset one copy: ``(obs, infos, alive)``; an exception of the env becomes a :class:`CopyFailure`."""
    try:
        obs, infos = episode_copy.reset(seed=seed, options=options)
    except Exception as error:
        return CopyFailure("reset", traceback.format_exc(), None, error if keep_error else None)
    return obs, infos, episode_copy.alive


def _parallel_copy(env: Any, max_episode_steps: int | None = None) -> _EpisodeCopy:
    """A copy of ``env`` (a parallel env, or an AEC env PettingZoo can run in parallel)."""
    return _EpisodeCopy(to_parallel_env(env), max_episode_steps)


def _rebuild_copy(
    copies: list[_EpisodeCopy],
    env_fns: Sequence[Callable[[], Any]],
    index: int,
    seed: int | None,
    keep_error: bool,
    make_copy: Callable[[Any, int | None], _EpisodeCopy] = _parallel_copy,
) -> tuple[dict, dict, dict] | CopyFailure:
    """Replace ``copies[index]`` by ``make_copy`` of a new env from ``env_fns[index]``, reset with ``seed``:
    ``(obs, infos, alive)``."""
    old = copies[index]
    try:
        old.env.close()
    except Exception:  # the env failed already: its close may fail too
        pass
    try:
        new = make_copy(env_fns[index](), old.max_episode_steps)
        copies[index] = new
        obs, infos = new.reset(seed=seed)
    except Exception as error:
        return CopyFailure("restart", traceback.format_exc(), None, error if keep_error else None)
    return obs, infos, new.alive


class _Rebuilt(NamedTuple):
    """A failed copy, rebuilt and reset: its reset's obs, infos and alive agents, and why it was rebuilt."""

    obs: dict
    infos: dict
    alive: dict
    error: str


class _Resolved(NamedTuple):
    """A copy's step result once failures are handled: the result, the failure's traceback if the copy was
    restarted, and whether its episode in progress was lost."""

    result: _CopyStep
    restart_error: str | None
    episode_lost: bool


def _lost_episode(rebuilt: _Rebuilt) -> _Resolved:
    """The step result of a copy whose episode was lost: no transition, the copy reset (done), no episode statistics."""
    return _Resolved(_CopyStep(rebuilt.obs, {}, {}, {}, {}, rebuilt.alive, True, {}, None), rebuilt.error, True)


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

    :param max_episode_steps: Truncate every copy's episode after this many steps (None: the env decides).
    """

    possible_agents: list[AgentID]
    observation_spaces: dict[AgentID, spaces.Space]
    action_spaces: dict[AgentID, spaces.Space]

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

    def _restart_copy(self, env_idx: int, failure: CopyFailure) -> _Rebuilt:
        """Rebuild a failed copy (again, while the rebuild itself fails) and reset it; raise past ``max_restarts``."""
        first = failure
        while True:
            self._count_restart(env_idx, failure)
            outcome = self._rebuild(env_idx, self._restart_seed(env_idx))
            if not isinstance(outcome, CopyFailure):
                obs, infos, alive = outcome
                return _Rebuilt(obs, infos, alive, f"env copy {env_idx} raised in {first.phase}:\n{first.traceback}")
            failure = outcome

    def _resolve_step(self, env_idx: int, result: _CopyStep | CopyFailure) -> _Resolved:
        """A copy's step result, with a failed copy restarted (or the error raised)."""
        if not isinstance(result, CopyFailure):
            return _Resolved(result, None, False)
        rebuilt = self._restart_copy(env_idx, result)
        if result.phase == "reset" and result.step_result is not None:
            # The episode had ended: only the next one's reset failed. Nothing is lost.
            return _Resolved(result.step_result._replace(obs=rebuilt.obs, alive=rebuilt.alive), rebuilt.error, False)
        return _lost_episode(rebuilt)

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

    def _collect_step(self, results: Sequence[_Resolved]) -> MultiAgentStep:
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


class DummyMultiAgentVecEnv(MultiAgentVecEnv):
    """Copies stepped one after the other in this process (SB3's ``DummyVecEnv`` counterpart).

    :param first_env: An env already made by ``env_fns[0]`` (``make_vec_env``'s probe), used as copy 0; a restart of
        copy 0 still makes a new one from ``env_fns[0]``.
    """

    def __init__(
        self,
        env_fns: Sequence[Callable[[], Any]],
        max_episode_steps: int | None = None,
        on_env_error: str = "raise",
        max_restarts: int = DEFAULT_MAX_RESTARTS,
        first_env: Any = None,
    ) -> None:
        self._env_fns = list(env_fns)
        self._copies = [
            self._make_copy(first_env if index == 0 and first_env is not None else env_fn(), max_episode_steps)
            for index, env_fn in enumerate(env_fns)
        ]
        self.envs = [episode_copy.env for episode_copy in self._copies]
        self._max_episode_steps = max_episode_steps
        first = self.envs[0]
        agents = list(first.possible_agents)
        super().__init__(
            len(self.envs),
            agents,
            {agent: first.observation_space(agent) for agent in agents},
            {agent: first.action_space(agent) for agent in agents},
            on_env_error=on_env_error,
            max_restarts=max_restarts,
        )

    def _set_max_episode_steps(self, value: int | None) -> None:
        for episode_copy in self._copies:
            episode_copy.max_episode_steps = value

    def reset(self) -> dict[AgentID, ObsArray]:  # type: ignore[override]
        results = [
            self._resolve_reset(idx, _reset_copy(self._copies[idx], self._seeds[idx], self._options[idx], keep_error=True))
            for idx in range(self.num_envs)
        ]
        return self._collect_reset(results)

    @staticmethod
    def _make_copy(env: Any, max_episode_steps: int | None) -> _EpisodeCopy:
        """One copy of a new env (at the start and at a restart)."""
        return _parallel_copy(env, max_episode_steps)

    def _check_actions(self, per_copy: list[dict[AgentID, Any]]) -> None:
        """Refuse the actions before any copy steps (nothing to refuse here)."""

    def _wait_agents(self) -> MultiAgentStep:
        assert self._actions is not None, "step_async must be called before step_agents or step_wait"
        per_copy = self._split_actions(self._actions)
        self._actions = None
        self._check_actions(per_copy)
        return self._collect_step(
            [
                self._resolve_step(idx, _step_copy(self._copies[idx], actions, keep_error=True))
                for idx, actions in enumerate(per_copy)
            ]
        )

    def _rebuild(self, env_idx: int, seed: int | None) -> tuple[dict, dict, dict] | CopyFailure:
        outcome = _rebuild_copy(self._copies, self._env_fns, env_idx, seed, keep_error=True, make_copy=self._make_copy)
        self.envs[env_idx] = self._copies[env_idx].env
        return outcome

    def close(self) -> None:
        for env in self.envs:
            env.close()

    def get_attr(self, attr_name: str, indices: VecEnvIndices = None) -> list[Any]:
        return [getattr(self.envs[idx].unwrapped, attr_name) for idx in self._get_indices(indices)]

    def set_attr(self, attr_name: str, value: Any, indices: VecEnvIndices = None) -> None:
        for idx in self._get_indices(indices):
            setattr(self.envs[idx].unwrapped, attr_name, value)

    def env_method(self, method_name: str, *method_args, indices: VecEnvIndices = None, **method_kwargs) -> list[Any]:
        return [
            getattr(self.envs[idx].unwrapped, method_name)(*method_args, **method_kwargs) for idx in self._get_indices(indices)
        ]


def make_vec_env(
    env_fn: Callable[..., Any],
    n_envs: int = 1,
    seed: int | None = None,
    vec_env_cls: str = "dummy",
    env_kwargs: dict[str, Any] | None = None,
    on_env_error: str = "raise",
    max_restarts: int = DEFAULT_MAX_RESTARTS,
    n_workers: int | None = None,
    ray_address: str | None = None,
) -> MultiAgentVecEnv:
    """Run ``n_envs`` copies of a PettingZoo env, each resetting itself at the end of its episodes.

    :param env_fn: A factory of PettingZoo envs, e.g. ``simple_spread_v3.parallel_env``. An AEC env is
        converted to a parallel one where PettingZoo allows it; otherwise (the classic games) its copies are stepped
        turn by turn (:mod:`sb3_ippo.turn_based`).
    :param n_envs: Number of copies.
    :param seed: Copy ``i`` is seeded with ``seed + i`` at its first reset (None: unseeded).
    :param vec_env_cls: ``"dummy"`` steps the copies in this process, ``"subproc"`` in worker processes, ``"ray"`` in
        Ray actors, on this machine or a cluster (needs ``pip install "sb3-ippo[ray]"``; see ``docs/usage.md``).
    :param env_kwargs: Keyword arguments for ``env_fn``.
    :param on_env_error: What a copy whose env raises in ``step`` or ``reset`` (or whose worker process dies)
        does: ``"raise"`` a ``RuntimeError`` with the env's traceback; ``"restart"``: the copy is rebuilt from
        ``env_fn``, reseeded (``seed + i + k * n_envs`` at its ``k``-th restart) and reset, only its episode in
        progress is lost, and the step reports it (``infos[i]["env_restarted"]``, ``MultiAgentStep.restarted``),
        which IPPO counts (``rollout/env_restarts``, ``rollout/episodes_lost``).
    :param max_restarts: With ``"restart"``: the restarts allowed in all (every rebuilt copy counts one); the next
        failure raises.
    :param n_workers: ``"subproc"``: worker processes (default ``min(n_envs, cpu_count)``); ``"ray"``: actors (default
        ``min(n_envs, CPUs of the Ray cluster)``). Each holds a contiguous slice of the copies.
    :param ray_address: ``"ray"``: the cluster to join if Ray is not initialized yet (None: start a local one;
        ``"auto"``: the one ``ray start --head`` started on this machine).
    """
    if not callable(env_fn):
        made = is_parallel_env(env_fn) or isinstance(env_fn, AECEnv)
        raise TypeError(
            "env_fn must be a callable that returns a PettingZoo env (e.g. simple_spread_v3.parallel_env, not called), "
            f"got {'the env ' if made else ''}{env_fn!r}"
        )
    if isinstance(env_fn, type) and issubclass(env_fn, gym.Env):
        raise TypeError(f"{env_fn.__name__} is a gymnasium env; make_vec_env needs a factory of PettingZoo envs")
    if not isinstance(n_envs, int) or n_envs < 1:
        raise ValueError(f"n_envs must be a positive integer, got {n_envs!r}")
    kwargs = env_kwargs or {}

    def make_env() -> Any:
        return env_fn(**kwargs)

    env_fns = [make_env for _ in range(n_envs)]
    vec_env: MultiAgentVecEnv
    check_env_error_policy(on_env_error, max_restarts)
    from sb3_ippo.turn_based import make_turn_based_vec_env, needs_turns  # turn_based builds on this module

    probe = make_env()  # used as copy 0 where the copies run in this process
    if needs_turns(probe):  # an AEC game that cannot run in parallel: its copies are stepped turn by turn
        vec_env = make_turn_based_vec_env(env_fns, vec_env_cls, on_env_error, max_restarts, first_env=probe)
    elif vec_env_cls == "dummy":
        vec_env = DummyMultiAgentVecEnv(env_fns, on_env_error=on_env_error, max_restarts=max_restarts, first_env=probe)
    else:
        if not isinstance(probe, type) and callable(getattr(probe, "close", None)):
            probe.close()
        if vec_env_cls == "subproc":
            from sb3_ippo.subproc_vec_env import SubprocMultiAgentVecEnv  # builds on this module

            vec_env = SubprocMultiAgentVecEnv(
                env_fns, n_workers=n_workers, on_env_error=on_env_error, max_restarts=max_restarts
            )
        elif vec_env_cls == "ray":
            from sb3_ippo.ray_vec_env import RayMultiAgentVecEnv  # imports Ray, only when asked for

            vec_env = RayMultiAgentVecEnv(
                env_fns, n_workers=n_workers, ray_address=ray_address, on_env_error=on_env_error, max_restarts=max_restarts
            )
        else:
            raise ValueError(f"vec_env_cls must be 'dummy', 'subproc' or 'ray', got {vec_env_cls!r}")
    if seed is not None:
        vec_env.seed(seed)
    return vec_env


def as_multiagent_vec_env(env: Any) -> MultiAgentVecEnv:
    """Wrap a single PettingZoo env (parallel or AEC) as a one-copy vectorized env; pass a vectorized one through."""
    if isinstance(env, MultiAgentVecEnv):
        return env
    if env is None:
        raise ValueError("An environment is needed: pass a PettingZoo ParallelEnv, an AECEnv, or make_vec_env(...)")
    if isinstance(env, VecNormalize):
        raise TypeError(
            "Got an SB3 VecNormalize: IPPO normalizes per agent itself. Pass the PettingZoo env or "
            "sb3_ippo.make_vec_env(...) unwrapped, with IPPO(..., normalize_obs=True) for observations (and "
            "normalize_returns=True, the default, for value targets)."
        )
    if isinstance(env, VecEnv):
        raise TypeError(
            f"Got the SB3 VecEnv {env}; sb3_ippo needs a PettingZoo env or sb3_ippo.make_vec_env(env_fn, n_envs=...)"
        )
    from sb3_ippo.turn_based import TurnBasedMultiAgentVecEnv, needs_turns  # turn_based builds on this module

    if needs_turns(env):
        return TurnBasedMultiAgentVecEnv([lambda: env])
    parallel_env = to_parallel_env(env)
    return DummyMultiAgentVecEnv([lambda: parallel_env])
