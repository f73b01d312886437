"""The update step of IPPO (each group's batches, fresh values and log-probs, GAE and PPO update) and the learner
process that runs it beside collection with ``async_training``.

:class:`Trainer` holds everything an update reads or changes: the policies and their optimizers, the return
normalizers and each group's settings. The model builds one over its own policies for a synchronous update
(``IPPO.train``); with ``async_training``, :class:`LearnerProcess` sends a pickled trainer to a child process once per
``learn``, and from then on only the drained trajectories and the per-update settings go in (:class:`UpdateJob`) and
only the trained weights, optimizer states, return statistics and update statistics come back
(:class:`UpdateResult`). The child keeps its copies of the policies between updates: it is the only trainer, and the
model applies each result at a deterministic point (``IPPO._finish_update_in_flight``), so both hold the same weights
once a result is applied.
"""

from __future__ import annotations

import functools
import os
import pickle
import signal
import threading
import traceback
from collections.abc import Mapping
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

import numpy as np
import torch as th
from gymnasium import spaces
from stable_baselines3.common.policies import ActorCriticPolicy
from stable_baselines3.common.utils import update_learning_rate

from sb3_ippo.buffer import Trajectory
from sb3_ippo.groups import GROUP_HYPERPARAMETERS, SCHEDULED_HYPERPARAMETERS
from sb3_ippo.normalization import ObservationNormalizer, ReturnNormalizer
from sb3_ippo.ppo_update import KLStop, UpdateStats, build_batch, ppo_update
from sb3_ippo.preprocessing import to_policy_observation
from sb3_ippo.stacked import StackedPolicies, stacked_build_batch, stacked_ppo_update
from sb3_ippo.vec_env import AgentID, ObsArray

# The hyperparameters a group may set for itself (IPPO's ``group_kwargs``) that the update reads as they are; the
# scheduled ones reach it as this update's values (``UpdateJob.learning_rates`` and ``clip_ranges``).
GROUP_UPDATE_SETTINGS = tuple(name for name in GROUP_HYPERPARAMETERS if name not in SCHEDULED_HYPERPARAMETERS)

# How long ``LearnerProcess.close`` waits for the learner to stop on its own before terminating it.
STOP_TIMEOUT = 5.0


@dataclass
class UpdateJob:
    """One update's work: each agent's drained trajectories, the observation statistics they are normalized with
    (read only), and the settings of this update (learning rate and clip ranges per group, from the schedules;
    minibatch shuffling seeds per agent)."""

    trajectories: dict[AgentID, list[Trajectory]]
    obs_normalizers: dict[AgentID, ObservationNormalizer] | None
    progress_remaining: float
    learning_rates: dict[str, float]
    clip_ranges: dict[str, tuple[float, float | None]]
    generator_seeds: dict[AgentID, int] | None


@dataclass
class GroupUpdate:
    """What the update needs to know of one agent group: its members, how they are trained (one shared policy,
    stacked as one batch, or one at a time) and its settings (``GROUP_UPDATE_SETTINGS``, the group's own or the
    model's)."""

    name: str
    agents: list[AgentID]
    share_parameters: bool
    stacked: bool
    settings: dict[str, Any]


@dataclass
class UpdateOptions:
    """The model-wide update settings."""

    recompute_values: bool
    recompute_log_prob: bool
    kl_stop: KLStop


@dataclass
class UpdateResult:
    """What a learner process sends back for one update: the trained policies' weights and optimizer states (one
    entry per trained policy, under the first of its agents), the return statistics, and the update statistics.

    The states hold NumPy arrays where ``state_dict`` has tensors (:func:`tensors_to_arrays`): pickle copies an array
    as one block of bytes, while a tensor goes through ``torch.save`` of its storage, which made the result of a
    three-agent MLP update take 14 ms to pickle and unpickle instead of under one.
    """

    stats: dict[AgentID, UpdateStats]
    policy_states: dict[AgentID, dict[str, Any]]
    optimizer_states: dict[AgentID, dict[str, Any]]
    return_normalizers: dict[AgentID, ReturnNormalizer] | None

    def install(self, policies: Mapping[AgentID, ActorCriticPolicy]) -> None:
        """Load the trained weights and optimizer states into ``policies`` (the model's, under the same agents)."""
        for agent, state in self.policy_states.items():
            policies[agent].load_state_dict(arrays_to_tensors(state))
            policies[agent].optimizer.load_state_dict(arrays_to_tensors(self.optimizer_states[agent]))


def tensors_to_arrays(tree: Any) -> Any:
    """``tree`` (dicts, lists and tuples of tensors and other values) with every tensor as a NumPy array on the CPU
    (bfloat16 ones, which NumPy lacks, stay tensors)."""
    if isinstance(tree, th.Tensor):
        tensor = tree.detach().cpu()
        return tensor if tensor.dtype == th.bfloat16 else tensor.numpy()
    if isinstance(tree, dict):
        return {key: tensors_to_arrays(value) for key, value in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(tensors_to_arrays(value) for value in tree)
    return tree


def arrays_to_tensors(tree: Any) -> Any:
    """The inverse of :func:`tensors_to_arrays`: every NumPy array as a tensor (sharing its memory)."""
    if isinstance(tree, np.ndarray):
        return th.from_numpy(tree)
    if isinstance(tree, dict):
        return {key: arrays_to_tensors(value) for key, value in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(arrays_to_tensors(value) for value in tree)
    return tree


@dataclass
class Trainer:
    """Runs updates on ``policies`` (``{agent: policy}``, a shared policy under each of its agents), changing them,
    their optimizers and ``return_normalizers`` in place. ``stacked`` caches the stacked view of each stacked group's
    policies; it is rebuilt after unpickling."""

    policies: dict[AgentID, ActorCriticPolicy]
    return_normalizers: dict[AgentID, ReturnNormalizer] | None
    groups: list[GroupUpdate]
    observation_spaces: dict[AgentID, spaces.Space]
    options: UpdateOptions
    stacked: dict[str, StackedPolicies] = field(default_factory=dict)

    def __getstate__(self) -> dict[str, Any]:
        # The stacked views hold functional copies of the modules; the learner rebuilds them from its policies.
        return {**self.__dict__, "stacked": {}}

    def update(self, job: UpdateJob) -> dict[AgentID, UpdateStats]:
        """Each group's batches (fresh values and log-probs, GAE) and PPO update: stacked members together, a shared
        policy on all its agents' trajectories, other agents one at a time."""
        stats: dict[AgentID, UpdateStats] = {}
        for group in self.groups:
            for agent in group.agents:
                update_learning_rate(self.policies[agent].optimizer, job.learning_rates[group.name])
            agents = [agent for agent in group.agents if agent in job.trajectories]
            if not agents:
                continue
            if group.share_parameters:
                # One policy: all its agents' trajectories, normalized by the group's shared normalizer, are one batch.
                shared = self._update_agent(job, group, agents[0], [t for agent in agents for t in job.trajectories[agent]])
                stats.update(dict.fromkeys(agents, shared))
            elif len(agents) > 1 and group.stacked:
                stats.update(zip(agents, self._update_stacked(job, group, agents), strict=True))
            else:
                stats.update({agent: self._update_agent(job, group, agent, job.trajectories[agent]) for agent in agents})
        return stats

    def policy_input(
        self, agent: AgentID, obs: ObsArray, obs_normalizers: Mapping[AgentID, ObservationNormalizer] | None
    ) -> ObsArray:
        """Raw observations as the agent's policy takes them: normalized with ``obs_normalizers``' (frozen)
        statistics, if any, images channel-first."""
        if obs_normalizers is not None:
            obs = obs_normalizers[agent].normalize(obs)
        return to_policy_observation(obs, self.observation_spaces[agent])

    def _update_kwargs(self, job: UpdateJob, group: GroupUpdate) -> dict[str, Any]:
        clip_range, clip_range_vf = job.clip_ranges[group.name]
        settings = group.settings
        return dict(
            n_epochs=settings["n_epochs"],
            batch_size=settings["batch_size"],
            clip_range=clip_range,
            clip_range_vf=clip_range_vf,
            normalize_advantage=settings["normalize_advantage"],
            ent_coef=settings["ent_coef"],
            vf_coef=settings["vf_coef"],
            max_grad_norm=settings["max_grad_norm"],
            target_kl=settings["target_kl"],
            kl_stop=self.options.kl_stop,
            shuffle_minibatches=settings["shuffle_minibatches"],
        )

    def _generator(self, job: UpdateJob, agent: AgentID) -> th.Generator | None:
        if job.generator_seeds is None:
            return None
        return th.Generator().manual_seed(job.generator_seeds[agent])

    def _update_agent(
        self, job: UpdateJob, group: GroupUpdate, agent: AgentID, trajectories: list[Trajectory]
    ) -> UpdateStats:
        """The reference path: one agent's (or one shared policy's) batch and update."""
        batch = build_batch(
            self.policies[agent],
            trajectories,
            gamma=group.settings["gamma"],
            gae_lambda=group.settings["gae_lambda"],
            recompute_values=self.options.recompute_values,
            recompute_log_prob=self.options.recompute_log_prob,
            preprocess_obs=functools.partial(self.policy_input, agent, obs_normalizers=job.obs_normalizers),
            return_normalizer=None if self.return_normalizers is None else self.return_normalizers[agent],
            time_limit_bootstrap=group.settings["time_limit_bootstrap"],
        )
        generator = self._generator(job, agent)
        return ppo_update(self.policies[agent], batch, generator=generator, **self._update_kwargs(job, group))

    def _update_stacked(self, job: UpdateJob, group: GroupUpdate, agents: list[AgentID]) -> list[UpdateStats]:
        """The batched path: the members' batches and updates as one (the same results as :meth:`_update_agent`)."""
        policies = [self.policies[agent] for agent in agents]
        stacked = self.stacked.get(group.name)
        if stacked is None or stacked.policies != policies:
            stacked = StackedPolicies(policies)  # the members that have data, or the learner's first update
            if len(agents) == len(group.agents):
                self.stacked[group.name] = stacked
        batch = stacked_build_batch(
            stacked,
            [job.trajectories[agent] for agent in agents],
            gamma=group.settings["gamma"],
            gae_lambda=group.settings["gae_lambda"],
            recompute_values=self.options.recompute_values,
            recompute_log_prob=self.options.recompute_log_prob,
            preprocess_obs=[
                functools.partial(self.policy_input, agent, obs_normalizers=job.obs_normalizers) for agent in agents
            ],
            return_normalizers=None if self.return_normalizers is None else [self.return_normalizers[a] for a in agents],
            time_limit_bootstrap=group.settings["time_limit_bootstrap"],
        )
        generators = None if job.generator_seeds is None else [self._generator(job, agent) for agent in agents]
        return stacked_ppo_update(stacked, batch, generators=generators, **self._update_kwargs(job, group))

    def result(self, stats: dict[AgentID, UpdateStats]) -> UpdateResult:
        """The weights and optimizer state of every policy this update trained (a shared one once)."""
        trained: dict[int, AgentID] = {}
        for agent in stats:
            trained.setdefault(id(self.policies[agent]), agent)
        return UpdateResult(
            stats=stats,
            policy_states={agent: tensors_to_arrays(self.policies[agent].state_dict()) for agent in trained.values()},
            optimizer_states={
                agent: tensors_to_arrays(self.policies[agent].optimizer.state_dict()) for agent in trained.values()
            },
            return_normalizers=self.return_normalizers,
        )


def _learner_main(connection: Connection) -> None:
    """The learner process: receive the trainer, then answer each job with its result until told to stop (None) or
    the connection closes. An exception in an update is sent back as its traceback, and the process ends."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is for the main process, which then stops this one.
    th.set_num_threads(1)
    th.manual_seed(0)  # Nothing in an update should draw from it; if something does, runs stay reproducible.
    try:
        trainer: Trainer = pickle.loads(connection.recv_bytes())
        while True:
            job: UpdateJob | None = pickle.loads(connection.recv_bytes())
            if job is None:
                # Told to stop, with every result sent: nothing is left to flush, and skipping the interpreter's
                # teardown (torch's modules, about 0.4 s) lets learn() return at once.
                connection.close()
                os._exit(0)
            result = trainer.result(trainer.update(job))
            connection.send_bytes(pickle.dumps(("result", result), protocol=pickle.HIGHEST_PROTOCOL))
    except (EOFError, BrokenPipeError, KeyboardInterrupt):
        return  # The main process is gone or stopping us.
    except BaseException:
        try:
            connection.send_bytes(pickle.dumps(("error", traceback.format_exc())))
        except OSError:
            pass


class LearnerProcess:
    """One child process (torch multiprocessing, spawn start method) that runs every update of one ``learn``.

    :param trainer: Pickled and sent once; the child trains its copy from then on.
    :raises TypeError: if the trainer cannot be pickled (e.g. a policy holding a lambda), naming what to change.
    """

    def __init__(self, trainer: Trainer) -> None:
        try:
            payload = pickle.dumps(trainer, protocol=pickle.HIGHEST_PROTOCOL)
        except (pickle.PicklingError, TypeError, AttributeError) as error:
            raise TypeError(
                "async_training sends the policies to a learner process, which needs them picklable, and they are not "
                f"({error}). Use picklable policy_kwargs (classes and functions defined at module level, no lambdas) "
                "or async_training=False."
            ) from error
        context = th.multiprocessing.get_context("spawn")
        self._connection, child_connection = context.Pipe()
        self.process = context.Process(target=_learner_main, args=(child_connection,), name="ippo-learner", daemon=True)
        self.process.start()
        child_connection.close()
        self._updates = 0
        # The child reads the trainer only once it has imported torch (a second or two): sending it from a thread lets
        # collection start meanwhile.
        self._sending = threading.Thread(target=self._send_quietly, args=(payload,), name="ippo-learner-send", daemon=True)
        self._sending.start()

    def _send_quietly(self, payload: bytes) -> None:
        try:
            self._connection.send_bytes(payload)
        except OSError:
            pass  # The learner died: result() says so.

    def _send(self, payload: bytes) -> None:
        self._sending.join()
        try:
            self._connection.send_bytes(payload)
        except OSError as error:
            raise self._died() from error

    def _died(self) -> RuntimeError:
        self.process.join(timeout=1.0)
        return RuntimeError(
            f"The async_training learner process (pid {self.process.pid}) died (exit code {self.process.exitcode}) "
            f"during update {self._updates}: the model keeps its last applied weights (save it, or learn again, which "
            "starts a new learner). A negative exit code is the signal that killed it (-9: killed, e.g. out of memory). "
            "Exit code 1 at the first update usually means a script without `if __name__ == \"__main__\":`: the learner "
            "is started with the spawn method, which imports the main module again."
        )

    def submit(self, job: UpdateJob) -> None:
        """Send one update's work; the observation statistics are pickled as they are now."""
        self._updates += 1
        self._send(pickle.dumps(job, protocol=pickle.HIGHEST_PROTOCOL))

    def result(self, poll_interval: float = 0.05) -> UpdateResult:
        """Wait for the submitted update's result.

        :raises RuntimeError: promptly if the learner raised (with its traceback) or died.
        """
        while not self._connection.poll(poll_interval):
            if not self.process.is_alive():
                if self._connection.poll(0):  # It may have sent its last words as it ended.
                    break
                raise self._died()
        try:
            kind, payload = pickle.loads(self._connection.recv_bytes())
        except (EOFError, OSError) as error:
            raise self._died() from error
        if kind == "error":
            raise RuntimeError(
                f"The async_training learner process failed in update {self._updates}; the model keeps its last "
                f"applied weights. The learner's traceback:\n{payload}"
            )
        return payload

    def close(self, timeout: float = STOP_TIMEOUT) -> None:
        """Stop the learner: ask it to end, wait up to ``timeout`` seconds, then terminate it, then kill it."""
        if self.process.is_alive() and timeout > 0:
            try:
                self._connection.send_bytes(pickle.dumps(None))
            except OSError:
                pass
            self.process.join(timeout)
        for stop in (self.process.terminate, self.process.kill):
            if not self.process.is_alive():
                break
            stop()
            self.process.join(1.0)
        self._connection.close()
