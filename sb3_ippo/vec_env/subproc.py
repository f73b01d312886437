"""Env copies stepped in worker processes: :class:`SubprocMultiAgentVecEnv` (``make_vec_env(vec_env_cls="subproc")``).

Each worker holds a contiguous slice of the copies and answers the parent's commands (:func:`_answer`, which the Ray
actors of :mod:`sb3_ippo.vec_env.ray` share), so the copies behave as in
:class:`~sb3_ippo.vec_env.dummy.DummyMultiAgentVecEnv`: the same auto-reset, alive masks, restarts and errors.
"""

from __future__ import annotations

import multiprocessing as mp
import signal
import traceback
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection
from typing import Any

import numpy as np
from stable_baselines3.common.vec_env.base_vec_env import CloudpickleWrapper, VecEnvIndices

from sb3_ippo.vec_env.base import (
    DEFAULT_MAX_RESTARTS,
    AgentID,
    MultiAgentStep,
    MultiAgentVecEnv,
    ObsArray,
    check_env_error_policy,
)
from sb3_ippo.vec_env.copies import (
    CopyFailure,
    EpisodeCopy,
    Rebuilt,
    Resolved,
    lost_episode,
    parallel_copy,
    rebuild_copy,
    reset_copy,
    step_copy,
)


def _answer(copies: list[EpisodeCopy], env_fns: Sequence[Callable[[], Any]], command: str, data: Any) -> Any:
    """What a worker sends back for one of the parent's commands."""
    if command == "step":
        return [step_copy(copy_, actions, keep_error=False) for copy_, actions in zip(copies, data, strict=True)]
    if command == "reset":
        return [
            reset_copy(episode_copy, seed, options, keep_error=False)
            for episode_copy, (seed, options) in zip(copies, data, strict=True)
        ]
    if command == "restart":
        local_index, seed = data
        return rebuild_copy(copies, env_fns, local_index, seed, keep_error=False)
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
        try:
            return [getattr(copies[i].env.unwrapped, name) for i in local_indices]
        except AttributeError as error:
            return error  # raised in the parent, as in-process copies raise it (SB3 reads render_mode so)
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
    """Run a slice of env copies in a worker process, answering the parent's commands until "close".

    An exception of an env comes back as a :class:`CopyFailure` for the parent to handle; any other exception
    ends the worker, after sending its traceback. Ctrl-C is left to the parent (it reaches the whole process
    group): the parent decides when the workers stop, so an interrupted ``learn`` can go on with the same env.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    parent_remote.close()
    copies: list[EpisodeCopy] = []
    env_fns = env_fns_wrapper.var
    try:
        copies = [parallel_copy(env_fn()) for env_fn in env_fns]
        while True:
            command, data = remote.recv()
            if command == "close":
                break
            remote.send(("ok", _answer(copies, env_fns, command, data)))
    except KeyboardInterrupt:
        pass
    except Exception:
        try:
            remote.send(("error", traceback.format_exc()))
        except (BrokenPipeError, EOFError):
            pass
    finally:
        for episode_copy in copies:
            try:
                episode_copy.env.close()
            except Exception:  # a failed env's close may fail too; the worker ends anyway
                pass
        remote.close()


class _WorkerDied(Exception):
    """A worker process died or failed outside its envs (with ``on_env_error="restart"``: its copies are rebuilt)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class SubprocMultiAgentVecEnv(MultiAgentVecEnv):
    """Copies stepped in worker processes, each worker holding a contiguous slice of the copies.

    With fewer cores than copies, one process per copy spends its time switching; so by default there are
    ``min(n_envs, cpu_count)`` workers. An env that raises, or a worker that dies, makes the parent raise a
    ``RuntimeError`` that carries the env's traceback or the worker's exit code, instead of hanging; or, with
    ``on_env_error="restart"``, the failed copy is rebuilt in its worker, and a dead worker is started anew with
    all its copies rebuilt (each counts as a restart). Restarts happen in ``step`` and ``reset``; a worker that dies
    in ``get_attr``, ``set_attr`` or ``env_method`` raises.

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
        on_env_error: str = "raise",
        max_restarts: int = DEFAULT_MAX_RESTARTS,
    ) -> None:
        check_env_error_policy(on_env_error, max_restarts)
        n_envs = len(env_fns)
        n_workers = min(n_envs, n_workers or mp.cpu_count() or 1)
        bounds = np.linspace(0, n_envs, n_workers + 1).astype(int)
        self._slices = [range(bounds[i], bounds[i + 1]) for i in range(n_workers)]
        if start_method is None:
            start_method = "forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn"
        self._ctx = mp.get_context(start_method)
        if start_method == "forkserver":
            # Workers fork from the server with this module (and torch, which SB3 imports) already loaded, instead
            # of importing them anew in every worker of every vectorized env, which takes seconds each time.
            self._ctx.set_forkserver_preload(["__main__", __name__])  # type: ignore[attr-defined]
        self._env_fns = list(env_fns)
        self.closed = False
        # Until the env is built, a failing worker raises whatever on_env_error says.
        self._started = False
        self.remotes: list[Connection] = []
        self.processes: list[Any] = []
        # Replies each worker owes (a command interrupted by Ctrl-C leaves one): read before the next command.
        self._awaiting: list[int] = []
        self._dead: dict[int, _WorkerDied] = {}
        for worker in range(n_workers):
            self.remotes.append(None)  # type: ignore[arg-type]
            self.processes.append(None)
            self._awaiting.append(0)
            self._start_worker(worker)
        self._max_episode_steps = None
        agents, observation_spaces, action_spaces = self._command(0, "spaces", None)
        super().__init__(
            n_envs, agents, observation_spaces, action_spaces, on_env_error=on_env_error, max_restarts=max_restarts
        )
        if max_episode_steps is not None:
            self.max_episode_steps = max_episode_steps
        self._started = True

    def _start_worker(self, worker: int) -> None:
        """Start the process of ``worker`` (a new one, after closing what is left of the old one)."""
        old_remote, old_process = self.remotes[worker], self.processes[worker]
        if old_remote is not None:
            old_remote.close()
        if old_process is not None:
            if old_process.is_alive():
                old_process.kill()
            old_process.join(timeout=5)
        remote, work_remote = self._ctx.Pipe()
        wrapper = CloudpickleWrapper([self._env_fns[i] for i in self._slices[worker]])
        process = self._ctx.Process(target=_worker, args=(work_remote, remote, wrapper), daemon=True)  # type: ignore[attr-defined]
        process.start()
        work_remote.close()
        self.remotes[worker], self.processes[worker] = remote, process
        self._awaiting[worker] = 0

    def _worker_lost(self, worker: int, what: str) -> None:
        reason = f"worker {worker} (env copies {list(self._slices[worker])}) {what}"
        if self._started and self.on_env_error == "restart":
            raise _WorkerDied(reason)
        self._fail(reason)

    def _receive(self, worker: int) -> Any:
        remote, process = self.remotes[worker], self.processes[worker]
        try:
            while not remote.poll(1.0):
                if not process.is_alive():
                    self._worker_lost(worker, f"died with exit code {process.exitcode}")
            status, payload = remote.recv()
        except (EOFError, ConnectionResetError, BrokenPipeError):
            # A worker that dies closes its end of the pipe (reset, if it dies while starting up): wait for its
            # exit code, which says why.
            process.join(timeout=1.0)
            self._worker_lost(worker, f"closed its pipe unexpectedly (exit code {process.exitcode})")
        self._awaiting[worker] -= 1
        if status == "error":
            self._worker_lost(worker, f"raised:\n{payload}")
        return payload

    def _fail(self, message: str) -> None:
        self.close()
        raise RuntimeError(f"SubprocMultiAgentVecEnv: {message}")

    def _env_error(self, message: str, failure: CopyFailure | str) -> None:
        self._fail(message)

    def _send(self, worker: int, command: str, data: Any) -> None:
        while self._awaiting[worker] > 0:
            self._receive(worker)  # the reply to a command that was interrupted: discarded
        try:
            self.remotes[worker].send((command, data))
        except (BrokenPipeError, ConnectionResetError):
            # The worker is gone, e.g. it died while starting up (an env factory that cannot be unpickled there).
            self.processes[worker].join(timeout=1.0)
            self._worker_lost(worker, f"is gone (exit code {self.processes[worker].exitcode})")
        self._awaiting[worker] += 1

    def _request(self, worker: int, command: str, data: Any) -> Any:
        self._send(worker, command, data)
        return self._receive(worker)

    def _command(self, worker: int, command: str, data: Any) -> Any:
        """A request outside ``step`` and ``reset``: a worker that dies meanwhile makes it raise."""
        try:
            return self._request(worker, command, data)
        except _WorkerDied as death:
            self._fail(death.reason)

    def _broadcast(self, command: str, per_worker_data: Sequence[Any]) -> list[Any]:
        if self.closed:
            raise RuntimeError(f"{type(self).__name__}: the env is closed")
        try:
            for worker, data in enumerate(per_worker_data):
                self._send(worker, command, data)
            return [self._receive(worker) for worker in range(len(self._slices))]
        except _WorkerDied as death:
            self._fail(death.reason)
            raise  # unreachable: _fail raises

    def _set_max_episode_steps(self, value: int | None) -> None:
        self._broadcast("max_episode_steps", [value] * len(self._slices))

    # --- Restarts ---------------------------------------------------------------------------------------------

    def _rebuild(self, env_idx: int, seed: int | None) -> tuple[dict, dict, dict] | CopyFailure:
        worker = next(w for w, env_slice in enumerate(self._slices) if env_idx in env_slice)
        return self._request(worker, "restart", (env_idx - self._slices[worker].start, seed))

    def _replace_worker(self, worker: int, reason: str) -> list[Rebuilt]:
        """Start a dead worker anew: all its copies are rebuilt (one restart each) and reset with new seeds."""
        while True:
            for env_idx in self._slices[worker]:
                self._count_restart(env_idx, reason)
            self._start_worker(worker)
            try:
                if self._max_episode_steps is not None:
                    self._request(worker, "max_episode_steps", self._max_episode_steps)
                seeds = [(self._restart_seed(env_idx), None) for env_idx in self._slices[worker]]
                rebuilt = []
                for env_idx, result in zip(self._slices[worker], self._request(worker, "reset", seeds), strict=True):
                    if isinstance(result, CopyFailure):
                        rebuilt.append(self._restart_copy(env_idx, result))
                    else:
                        obs, infos, alive = result
                        rebuilt.append(Rebuilt(obs, infos, alive, reason))
                return rebuilt
            except _WorkerDied as death:
                reason = death.reason

    def _send_to_all(self, command: str, per_worker_data: Sequence[Any]) -> None:
        """Send a step or reset to every worker; a dead one is noted, for its results to be replaced."""
        if self.closed:
            raise RuntimeError(f"{type(self).__name__}: the env is closed")
        for worker, data in enumerate(per_worker_data):
            try:
                self._send(worker, command, data)
            except _WorkerDied as death:
                self._dead[worker] = death

    def _results_of(self, worker: int) -> list[Any]:
        death = self._dead.pop(worker, None)
        if death is not None:
            raise death
        return self._receive(worker)

    def reset(self) -> dict[AgentID, ObsArray]:  # type: ignore[override]
        self._send_to_all("reset", [[(self._seeds[i], self._options[i]) for i in env_slice] for env_slice in self._slices])
        results: list[tuple[dict, dict, str | None]] = []
        for worker, env_slice in enumerate(self._slices):
            try:
                worker_results = [
                    self._resolve_reset(env_idx, result)
                    for env_idx, result in zip(env_slice, self._results_of(worker), strict=True)
                ]
            except _WorkerDied as death:
                worker_results = [(r.obs, r.infos, r.error) for r in self._replace_worker(worker, death.reason)]
            results.extend(worker_results)
        return self._collect_reset(results)

    def step_async(self, actions: dict[AgentID, np.ndarray]) -> None:  # type: ignore[override]
        if self.closed:
            raise RuntimeError(f"{type(self).__name__}: the env is closed")
        per_copy = self._split_actions(actions)
        self._send_to_all("step", [[per_copy[i] for i in env_slice] for env_slice in self._slices])

    def _wait_agents(self) -> MultiAgentStep:
        results: list[Resolved] = []
        for worker, env_slice in enumerate(self._slices):
            try:
                worker_results = [
                    self._resolve_step(env_idx, result)
                    for env_idx, result in zip(env_slice, self._results_of(worker), strict=True)
                ]
            except _WorkerDied as death:
                # Every copy of the worker is rebuilt: all their episodes in progress are lost.
                worker_results = [lost_episode(rebuilt) for rebuilt in self._replace_worker(worker, death.reason)]
            results.extend(worker_results)
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
        values = []
        for worker, local in self._by_worker(indices):
            answer = self._command(worker, "get_attr", (local, attr_name))
            if isinstance(answer, AttributeError):
                raise AttributeError(str(answer))
            values.extend(answer)
        return values

    def set_attr(self, attr_name: str, value: Any, indices: VecEnvIndices = None) -> None:
        for worker, local in self._by_worker(indices):
            self._command(worker, "set_attr", (local, attr_name, value))

    def env_method(self, method_name: str, *method_args, indices: VecEnvIndices = None, **method_kwargs) -> list[Any]:
        return [
            value
            for worker, local in self._by_worker(indices)
            for value in self._command(worker, "env_method", (local, method_name, method_args, method_kwargs))
        ]
