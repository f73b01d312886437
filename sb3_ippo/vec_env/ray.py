"""Env copies in Ray actors: ``make_vec_env(..., vec_env_cls="ray")``, for envs too expensive for one machine.

Each actor holds a contiguous slice of the copies and answers the same commands as a worker process of
``vec_env_cls="subproc"`` (``sb3_ippo.vec_env.subproc._answer``), so the semantics are the same: auto-reset, alive masks,
final observations, seeding (copy ``i``: ``seed + i``), restarts with ``on_env_error="restart"``, and a clear
``RuntimeError`` when an env raises or an actor dies. Only the transport differs: Ray remote calls instead of pipes.

This module imports Ray; ``sb3_ippo`` imports it only when ``vec_env_cls="ray"`` is asked for.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

try:
    import ray
    from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
except ImportError as error:  # pragma: no cover - depends on the installation
    raise ImportError(
        'vec_env_cls="ray" needs Ray: pip install "sb3-ippo[ray]" (or, from a checkout, pip install -e ".[ray]")'
    ) from error

from sb3_ippo.vec_env.base import DEFAULT_MAX_RESTARTS, MultiAgentVecEnv, check_env_error_policy
from sb3_ippo.vec_env.copies import parallel_copy
from sb3_ippo.vec_env.subproc import SubprocMultiAgentVecEnv, _answer

# How long close() waits for an actor to close its envs before killing it.
CLOSE_TIMEOUT = 5.0


class _EnvRunner:
    """The Ray actor: a slice of env copies, answering the parent's commands (as a subprocess worker does)."""

    def __init__(self, env_fns: Sequence[Callable[[], Any]]) -> None:
        self.env_fns = list(env_fns)
        self.copies = [parallel_copy(env_fn()) for env_fn in self.env_fns]

    def node_id(self) -> str:
        """The id of the Ray node this actor runs on."""
        return ray.get_runtime_context().get_node_id()

    def answer(self, command: str, data: Any) -> Any:
        return _answer(self.copies, self.env_fns, command, data)

    def close(self) -> None:
        for episode_copy in self.copies:
            try:
                episode_copy.env.close()
            except Exception:  # a failed env's close may fail too; the actor is killed anyway
                pass


class RayMultiAgentVecEnv(SubprocMultiAgentVecEnv):
    """Copies stepped in Ray actors, each actor holding a contiguous slice of the copies (``n_workers`` actors).

    Largely identical to :class:`~sb3_ippo.vec_env.subproc.SubprocMultiAgentVecEnv` (same restarts and errors); a worker is
    an actor here. Ray is started with ``ray.init(address=ray_address)`` unless it already runs in this process: None
    starts a local instance, ``"auto"`` joins the cluster started by ``ray start --head`` on this machine, and
    ``"ray://host:10001"`` a remote one. The env factories (and the packages they need) must be importable where the
    actors run: install them on every node, or pass a ``runtime_env`` to ``ray.init`` yourself before.

    :param env_fns: Factories of PettingZoo envs, one per copy (pickled with cloudpickle).
    :param n_workers: Number of actors (default: ``min(len(env_fns), CPUs of the Ray cluster)``).
    :param ray_address: Where Ray runs (see above).
    :param actor_options: Options of every actor (``ray.remote``'s, e.g. ``{"num_cpus": 1}`` to reserve a CPU each).
        Without a ``scheduling_strategy``, actor ``w`` is placed on the ``w % n``-th of the cluster's ``n`` nodes that have
        CPUs (soft node affinity: where that node cannot take it, Ray places it elsewhere), so the actors span the
        nodes; an actor started anew after its node is lost goes to a node that is still there.
    """

    def __init__(
        self,
        env_fns: Sequence[Callable[[], Any]],
        max_episode_steps: int | None = None,
        n_workers: int | None = None,
        ray_address: str | None = None,
        actor_options: dict[str, Any] | None = None,
        on_env_error: str = "raise",
        max_restarts: int = DEFAULT_MAX_RESTARTS,
    ) -> None:
        check_env_error_policy(on_env_error, max_restarts)
        if not ray.is_initialized():
            ray.init(address=ray_address, include_dashboard=False, log_to_driver=False)
        n_envs = len(env_fns)
        n_workers = min(n_envs, n_workers or int(ray.cluster_resources().get("CPU", 1)) or 1)
        bounds = np.linspace(0, n_envs, n_workers + 1).astype(int)
        self._slices = [range(bounds[i], bounds[i + 1]) for i in range(n_workers)]
        self._env_fns = list(env_fns)
        self._actor_class = ray.remote(**(actor_options or {}))(_EnvRunner) if actor_options else ray.remote(_EnvRunner)
        self._spread = "scheduling_strategy" not in (actor_options or {})
        self.closed = False
        self._started = False
        self.actors: list[Any] = [None] * n_workers
        self._pending: list[deque[Any]] = [deque() for _ in range(n_workers)]
        self._awaiting = [0] * n_workers
        self._dead: dict[int, Any] = {}
        for worker in range(n_workers):
            self._start_worker(worker)
        self._max_episode_steps = None
        agents, observation_spaces, action_spaces = self._command(0, "spaces", None)
        MultiAgentVecEnv.__init__(
            self, n_envs, agents, observation_spaces, action_spaces, on_env_error=on_env_error, max_restarts=max_restarts
        )
        if max_episode_steps is not None:
            self.max_episode_steps = max_episode_steps
        self._started = True

    def _start_worker(self, worker: int) -> None:
        """Create the actor of ``worker`` (a new one, after killing what is left of the old one)."""
        if self.actors[worker] is not None:
            ray.kill(self.actors[worker])
        self.actors[worker] = self._actor_class.options(**self._placement(worker)).remote(
            [self._env_fns[i] for i in self._slices[worker]]
        )
        self._pending[worker].clear()
        self._awaiting[worker] = 0

    def _placement(self, worker: int) -> dict[str, Any]:
        """The scheduling options of ``worker``'s actor: the next live node with CPUs, round robin (see the class)."""
        nodes = [node["NodeID"] for node in ray.nodes() if node["Alive"] and node["Resources"].get("CPU", 0) > 0]
        if not self._spread or len(nodes) < 2:
            return {}
        return {"scheduling_strategy": NodeAffinitySchedulingStrategy(nodes[worker % len(nodes)], soft=True)}

    def runner_nodes(self) -> list[str]:
        """The id of the Ray node each actor runs on (``ray.nodes()`` describes them), one entry per actor."""
        return ray.get([actor.node_id.remote() for actor in self.actors])

    def _fail(self, message: str) -> None:
        self.close()
        raise RuntimeError(f"RayMultiAgentVecEnv: {message}")

    def _send(self, worker: int, command: str, data: Any) -> None:
        while self._awaiting[worker] > 0:
            self._receive(worker)  # the reply to a command that was interrupted: discarded
        self._pending[worker].append(self.actors[worker].answer.remote(command, data))
        self._awaiting[worker] += 1

    def _receive(self, worker: int) -> Any:
        reply = self._pending[worker].popleft()
        self._awaiting[worker] -= 1
        try:
            return ray.get(reply)
        except RayTaskError as error:
            # Not an env's exception (those come back as CopyFailure): the actor's own code failed.
            self._worker_lost(worker, f"raised:\n{error}")
        except RayActorError as error:
            self._worker_lost(worker, f"died (its actor is gone: {error})")

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        closing = [actor.close.remote() for actor in self.actors if actor is not None]
        try:
            ray.get(closing, timeout=CLOSE_TIMEOUT)
        except (RayActorError, RayTaskError, GetTimeoutError):
            pass  # a dead or stuck actor is killed below
        for actor in self.actors:
            if actor is not None:
                ray.kill(actor)
