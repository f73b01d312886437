"""The multi-agent vectorized environment: ``n_envs`` copies of a PettingZoo parallel env, as per-agent arrays.

Every array the layer hands out is keyed by agent id and has ``n_envs`` rows, one per env copy. An agent that
is not alive in a copy (it left the episode, or the env did not spawn it) has its row masked out by ``alive``:
it gets no action and produces no transition until that copy starts a new episode.
"""

from __future__ import annotations

import multiprocessing as mp
import time
import traceback
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection
from typing import Any, NamedTuple

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from pettingzoo import AECEnv, ParallelEnv
from pettingzoo.utils.conversions import aec_to_parallel
from stable_baselines3.common.monitor import Monitor
from stable_baselines3.common.vec_env.base_vec_env import CloudpickleWrapper, VecEnv, VecEnvIndices, VecEnvStepReturn

AgentID = str
ObsArray = np.ndarray | dict[str, np.ndarray]


class MultiAgentStep(NamedTuple):
    """What one vectorized step returns (``MultiAgentVecEnv.step_agents``). Every per-agent array has ``n_envs`` rows.

    ``rewards``, ``terminations`` and ``truncations`` are meaningful only where the agent acted in this step
    (zero/False elsewhere). ``final_obs[agent][env_idx]`` is the observation an agent's trajectory ended on in
    this step (terminated, truncated, or left the env), which ``obs`` no longer holds once a copy has reset.
    ``dones[env_idx]`` says that copy's episode ended and the copy was reset: ``obs`` and ``alive`` then
    describe the first step of its next episode, and ``infos[env_idx]["episode"]`` holds its statistics.
    """

    obs: dict[AgentID, ObsArray]
    rewards: dict[AgentID, np.ndarray]
    terminations: dict[AgentID, np.ndarray]
    truncations: dict[AgentID, np.ndarray]
    alive: dict[AgentID, np.ndarray]
    dones: np.ndarray
    infos: list[dict[str, Any]]
    final_obs: dict[AgentID, dict[int, Any]]

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
        try:
            return aec_to_parallel(env)
        except AssertionError as error:
            raise ValueError(
                f"The AEC environment {env} cannot be converted to a parallel environment: {error} "
                "Pass a PettingZoo ParallelEnv (most envs have `parallel_env()`), or an AEC env whose "
                "metadata sets is_parallelizable=True."
            ) from error
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

    def step(self, actions: dict[AgentID, Any]) -> tuple:
        """Step the alive agents; reset when no agent is left.

        :return: obs, rewards, terminations, truncations, infos, alive agents, episode done, final obs, episode info.
        """
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
            obs, _ = self.reset()
        return obs, rewards, terminations, truncations, infos, self.alive, done, final_obs, episode


class MultiAgentVecEnv(VecEnv):
    """``n_envs`` copies of a PettingZoo parallel env, stepped together, with per-agent arrays of ``n_envs`` rows.

    ``observation_space`` and ``action_space`` are ``spaces.Dict`` keyed by agent id (SB3's ``VecEnv`` needs
    one space each); ``observation_spaces[agent]`` and ``action_spaces[agent]`` are the agents' own spaces.
    ``step`` takes ``{agent_id: actions of shape (n_envs, *act_shape)}`` and returns a :class:`MultiAgentStep`.

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
    ) -> None:
        self.possible_agents = list(possible_agents)
        self.observation_spaces = observation_spaces
        self.action_spaces = action_spaces
        self._obs = {agent: _allocate(space, num_envs) for agent, space in observation_spaces.items()}
        self._alive = {agent: np.zeros(num_envs, dtype=bool) for agent in self.possible_agents}
        self._actions: dict[AgentID, np.ndarray] | None = None
        super().__init__(num_envs, spaces.Dict(observation_spaces), spaces.Dict(action_spaces))

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

    def _collect_reset(self, results: Sequence[tuple[dict, dict]]) -> dict[AgentID, ObsArray]:
        for env_idx, (obs, infos) in enumerate(results):
            self.reset_infos[env_idx] = {"agents": infos}
            for agent in self.possible_agents:
                alive = agent in obs
                self._alive[agent][env_idx] = alive
                if alive:
                    _write(self._obs[agent], env_idx, obs[agent])
        self._reset_seeds()
        self._reset_options()
        return {agent: copy_obs(obs) for agent, obs in self._obs.items()}

    def _collect_step(self, results: Sequence[tuple]) -> MultiAgentStep:
        n_envs = self.num_envs
        rewards = {agent: np.zeros(n_envs, dtype=np.float32) for agent in self.possible_agents}
        terminations = {agent: np.zeros(n_envs, dtype=bool) for agent in self.possible_agents}
        truncations = {agent: np.zeros(n_envs, dtype=bool) for agent in self.possible_agents}
        final_obs: dict[AgentID, dict[int, Any]] = {agent: {} for agent in self.possible_agents}
        dones = np.zeros(n_envs, dtype=bool)
        infos: list[dict[str, Any]] = []
        for env_idx, (obs, step_rewards, step_terms, step_truncs, step_infos, alive, done, ends, episode) in enumerate(
            results
        ):
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
            if done:
                dones[env_idx] = True
                info["episode"] = episode
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
    """Copies stepped one after the other in this process (SB3's ``DummyVecEnv`` counterpart)."""

    def __init__(self, env_fns: Sequence[Callable[[], Any]], max_episode_steps: int | None = None) -> None:
        self.envs = [to_parallel_env(env_fn()) for env_fn in env_fns]
        self._copies = [_EpisodeCopy(env, max_episode_steps) for env in self.envs]
        self._max_episode_steps = max_episode_steps
        first = self.envs[0]
        agents = list(first.possible_agents)
        super().__init__(
            len(self.envs),
            agents,
            {agent: first.observation_space(agent) for agent in agents},
            {agent: first.action_space(agent) for agent in agents},
        )

    def _set_max_episode_steps(self, value: int | None) -> None:
        for episode_copy in self._copies:
            episode_copy.max_episode_steps = value

    def reset(self) -> dict[AgentID, ObsArray]:  # type: ignore[override]
        results = [
            episode_copy.reset(seed=self._seeds[idx], options=self._options[idx])
            for idx, episode_copy in enumerate(self._copies)
        ]
        return self._collect_reset(results)

    def _wait_agents(self) -> MultiAgentStep:
        assert self._actions is not None, "step_async must be called before step_agents or step_wait"
        per_copy = self._split_actions(self._actions)
        self._actions = None
        return self._collect_step(
            [episode_copy.step(actions) for episode_copy, actions in zip(self._copies, per_copy, strict=True)]
        )

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


def _answer(copies: list[_EpisodeCopy], command: str, data: Any) -> Any:
    """What a worker sends back for one of the parent's commands."""
    if command == "step":
        return [episode_copy.step(actions) for episode_copy, actions in zip(copies, data, strict=True)]
    if command == "reset":
        return [episode_copy.reset(seed, options) for episode_copy, (seed, options) in zip(copies, data, strict=True)]
    if command == "spaces":
        env = copies[0].env
        agents = list(env.possible_agents)
        return (
            agents,
            {agent: env.observation_space(agent) for agent in agents},
            {agent: env.action_space(agent) for agent in agents},
        )
    if command == "max_episode_steps":
        for episode_copy in copies:
            episode_copy.max_episode_steps = data
        return None
    if command == "get_attr":
        local_indices, name = data
        return [getattr(copies[i].env.unwrapped, name) for i in local_indices]
    if command == "set_attr":
        local_indices, name, value = data
        for i in local_indices:
            setattr(copies[i].env.unwrapped, name, value)
        return None
    if command == "env_method":
        local_indices, name, args, kwargs = data
        return [getattr(copies[i].env.unwrapped, name)(*args, **kwargs) for i in local_indices]
    raise NotImplementedError(f"Unknown command {command!r}")


def _worker(remote: Connection, parent_remote: Connection, env_fns_wrapper: CloudpickleWrapper) -> None:
    """Run a slice of env copies in a worker process, answering the parent's commands until "close"."""
    parent_remote.close()
    copies: list[_EpisodeCopy] = []
    try:
        copies = [_EpisodeCopy(to_parallel_env(env_fn())) for env_fn in env_fns_wrapper.var]
        while True:
            command, data = remote.recv()
            if command == "close":
                break
            remote.send(("ok", _answer(copies, command, data)))
    except KeyboardInterrupt:
        pass
    except Exception:
        try:
            remote.send(("error", traceback.format_exc()))
        except (BrokenPipeError, EOFError):
            pass
    finally:
        for episode_copy in copies:
            episode_copy.env.close()
        remote.close()


class SubprocMultiAgentVecEnv(MultiAgentVecEnv):
    """Copies stepped in worker processes, each worker holding a contiguous slice of the copies.

    With fewer cores than copies, one process per copy spends its time switching; so by default there are
    ``min(n_envs, cpu_count)`` workers. A worker that raises, or dies, makes the parent raise a ``RuntimeError``
    that carries the worker's traceback or exit code, instead of hanging.

    :param env_fns: Factories of PettingZoo envs, one per copy. They must be picklable (cloudpickle).
    :param start_method: multiprocessing start method (default: "forkserver" where available, else "spawn").
    :param n_workers: Number of worker processes (default: ``min(len(env_fns), cpu_count)``).
    """

    def __init__(
        self,
        env_fns: Sequence[Callable[[], Any]],
        max_episode_steps: int | None = None,
        start_method: str | None = None,
        n_workers: int | None = None,
    ) -> None:
        n_envs = len(env_fns)
        n_workers = min(n_envs, n_workers or mp.cpu_count() or 1)
        bounds = np.linspace(0, n_envs, n_workers + 1).astype(int)
        self._slices = [range(bounds[i], bounds[i + 1]) for i in range(n_workers)]
        if start_method is None:
            start_method = "forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn"
        ctx = mp.get_context(start_method)
        if start_method == "forkserver":
            # Workers fork from the server with this module (and torch, which SB3 imports) already loaded, instead
            # of importing them anew in every worker of every vectorized env, which takes seconds each time.
            ctx.set_forkserver_preload(["__main__", __name__])  # type: ignore[attr-defined]
        self.closed = False
        self.remotes, self.processes = [], []
        for env_slice in self._slices:
            remote, work_remote = ctx.Pipe()
            wrapper = CloudpickleWrapper([env_fns[i] for i in env_slice])
            process = ctx.Process(target=_worker, args=(work_remote, remote, wrapper), daemon=True)  # type: ignore[attr-defined]
            process.start()
            work_remote.close()
            self.remotes.append(remote)
            self.processes.append(process)
        self._max_episode_steps = None
        agents, observation_spaces, action_spaces = self._request(0, "spaces", None)
        super().__init__(n_envs, agents, observation_spaces, action_spaces)
        if max_episode_steps is not None:
            self.max_episode_steps = max_episode_steps

    def _receive(self, worker: int) -> Any:
        remote, process = self.remotes[worker], self.processes[worker]
        while not remote.poll(1.0):
            if not process.is_alive():
                self._fail(f"worker {worker} (env copies {list(self._slices[worker])}) died with exit code {process.exitcode}")
        try:
            status, payload = remote.recv()
        except (EOFError, ConnectionResetError):
            # A worker that dies closes its end of the pipe (reset, if it dies while starting up): wait for its
            # exit code, which says why.
            process.join(timeout=1.0)
            self._fail(
                f"worker {worker} (env copies {list(self._slices[worker])}) closed its pipe unexpectedly "
                f"(exit code {process.exitcode})"
            )
        if status == "error":
            self._fail(f"an env copy in worker {worker} (env copies {list(self._slices[worker])}) raised:\n{payload}")
        return payload

    def _fail(self, message: str) -> None:
        self.close()
        raise RuntimeError(f"SubprocMultiAgentVecEnv: {message}")

    def _send(self, worker: int, command: str, data: Any) -> None:
        try:
            self.remotes[worker].send((command, data))
        except (BrokenPipeError, ConnectionResetError):
            # The worker is gone, e.g. it died while starting up (an env factory that cannot be unpickled there).
            self.processes[worker].join(timeout=1.0)
            self._fail(
                f"worker {worker} (env copies {list(self._slices[worker])}) is gone "
                f"(exit code {self.processes[worker].exitcode})"
            )

    def _request(self, worker: int, command: str, data: Any) -> Any:
        self._send(worker, command, data)
        return self._receive(worker)

    def _broadcast(self, command: str, per_worker_data: Sequence[Any]) -> list[Any]:
        if self.closed:
            raise RuntimeError("SubprocMultiAgentVecEnv: the env is closed")
        for worker, data in enumerate(per_worker_data):
            self._send(worker, command, data)
        return [self._receive(worker) for worker in range(len(self.remotes))]

    def _set_max_episode_steps(self, value: int | None) -> None:
        self._broadcast("max_episode_steps", [value] * len(self.remotes))

    def reset(self) -> dict[AgentID, ObsArray]:  # type: ignore[override]
        data = [[(self._seeds[i], self._options[i]) for i in env_slice] for env_slice in self._slices]
        results = [result for worker_results in self._broadcast("reset", data) for result in worker_results]
        return self._collect_reset(results)

    def step_async(self, actions: dict[AgentID, np.ndarray]) -> None:  # type: ignore[override]
        if self.closed:
            raise RuntimeError("SubprocMultiAgentVecEnv: the env is closed")
        per_copy = self._split_actions(actions)
        for worker, env_slice in enumerate(self._slices):
            self._send(worker, "step", [per_copy[i] for i in env_slice])

    def _wait_agents(self) -> MultiAgentStep:
        results = [result for worker in range(len(self.remotes)) for result in self._receive(worker)]
        return self._collect_step(results)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        for remote, process in zip(self.remotes, self.processes, strict=True):
            if process.is_alive():
                try:
                    remote.send(("close", None))
                except (BrokenPipeError, OSError):
                    pass
        for process in self.processes:
            process.join(timeout=5)
            if process.is_alive():
                process.terminate()
        for remote in self.remotes:
            remote.close()

    def _by_worker(self, indices: VecEnvIndices) -> list[tuple[int, list[int]]]:
        """Map global copy indices to (worker, local indices) pairs."""
        wanted = set(self._get_indices(indices))
        pairs = []
        for worker, env_slice in enumerate(self._slices):
            local = [i - env_slice.start for i in env_slice if i in wanted]
            if local:
                pairs.append((worker, local))
        return pairs

    def get_attr(self, attr_name: str, indices: VecEnvIndices = None) -> list[Any]:
        return [
            value
            for worker, local in self._by_worker(indices)
            for value in self._request(worker, "get_attr", (local, attr_name))
        ]

    def set_attr(self, attr_name: str, value: Any, indices: VecEnvIndices = None) -> None:
        for worker, local in self._by_worker(indices):
            self._request(worker, "set_attr", (local, attr_name, value))

    def env_method(self, method_name: str, *method_args, indices: VecEnvIndices = None, **method_kwargs) -> list[Any]:
        return [
            value
            for worker, local in self._by_worker(indices)
            for value in self._request(worker, "env_method", (local, method_name, method_args, method_kwargs))
        ]


def make_vec_env(
    env_fn: Callable[..., Any],
    n_envs: int = 1,
    seed: int | None = None,
    vec_env_cls: str = "dummy",
    env_kwargs: dict[str, Any] | None = None,
) -> MultiAgentVecEnv:
    """Run ``n_envs`` copies of a PettingZoo env, each resetting itself at the end of its episodes.

    :param env_fn: A factory of PettingZoo envs, e.g. ``simple_spread_v3.parallel_env``. An AEC env is
        converted to a parallel one where PettingZoo allows it; otherwise (the classic games) its copies are stepped
        turn by turn (:mod:`sb3_ippo.turn_based`).
    :param n_envs: Number of copies.
    :param seed: Copy ``i`` is seeded with ``seed + i`` at its first reset (None: unseeded).
    :param vec_env_cls: ``"dummy"`` steps the copies in this process, ``"subproc"`` in worker processes.
    :param env_kwargs: Keyword arguments for ``env_fn``.
    """
    if not callable(env_fn):
        raise TypeError(
            f"env_fn must be a callable that returns a PettingZoo env (e.g. simple_spread_v3.parallel_env), got {env_fn!r}"
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
    from sb3_ippo.turn_based import make_turn_based_vec_env, needs_turns  # turn_based builds on this module

    probe = make_env()
    if needs_turns(probe):  # an AEC game that cannot run in parallel: its copies are stepped turn by turn
        vec_env = make_turn_based_vec_env([lambda: probe, *env_fns[1:]], vec_env_cls)
        if seed is not None:
            vec_env.seed(seed)
        return vec_env
    if hasattr(probe, "close"):
        probe.close()
    if vec_env_cls == "dummy":
        vec_env = DummyMultiAgentVecEnv(env_fns)
    elif vec_env_cls == "subproc":
        vec_env = SubprocMultiAgentVecEnv(env_fns)
    else:
        raise ValueError(f"vec_env_cls must be 'dummy' or 'subproc', got {vec_env_cls!r}")
    if seed is not None:
        vec_env.seed(seed)
    return vec_env


def as_multiagent_vec_env(env: Any) -> MultiAgentVecEnv:
    """Wrap a single PettingZoo env (parallel or AEC) as a one-copy vectorized env; pass a vectorized one through."""
    if isinstance(env, MultiAgentVecEnv):
        return env
    if env is None:
        raise ValueError("An environment is needed: pass a PettingZoo ParallelEnv, an AECEnv, or make_vec_env(...)")
    if isinstance(env, VecEnv):
        raise TypeError(
            f"Got the SB3 VecEnv {env}; sb3_ippo needs a PettingZoo env or sb3_ippo.make_vec_env(env_fn, n_envs=...)"
        )
    from sb3_ippo.turn_based import TurnBasedMultiAgentVecEnv, needs_turns  # turn_based builds on this module

    if needs_turns(env):
        return TurnBasedMultiAgentVecEnv([lambda: env])
    parallel_env = to_parallel_env(env)
    return DummyMultiAgentVecEnv([lambda: parallel_env])
