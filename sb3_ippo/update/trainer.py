"""The update step of IPPO: each group's batches (fresh values and log-probs, GAE) and PPO updates.

:class:`Trainer` holds everything an update reads or changes: the group runners (the policies and their optimizers)
and the return normalizers. The model builds one when it is set up and keeps it for its lifetime: a synchronous
update (``IPPO.train``) runs it in place on the model's own policies and normalizers; with ``async_training``, the
learner process (:mod:`sb3_ippo.update.learner`) runs its own unpickled copy and sends back an :class:`UpdateResult`,
which the model applies in place (:meth:`UpdateResult.install`). Either way the model's policies and normalizers are
the objects of record, changed in place.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch as th
from stable_baselines3.common.policies import ActorCriticPolicy

from sb3_ippo.common.buffer import Trajectory
from sb3_ippo.common.normalization import ObservationNormalizer, ReturnNormalizer
from sb3_ippo.common.type_aliases import AgentID
from sb3_ippo.update.ppo import UpdateStats
from sb3_ippo.update.runners import GroupRunner
from sb3_ippo.update.settings import UpdateSettings


@dataclass
class UpdateJob:
    """One update's work: each agent's drained trajectories, the observation statistics they are normalized with
    (read only), each group's settings for this update (schedules read at ``progress_remaining``), and the seeds of
    the members' minibatch shuffling (None: no group shuffles)."""

    trajectories: dict[AgentID, list[Trajectory]]
    obs_normalizers: dict[AgentID, ObservationNormalizer] | None
    progress_remaining: float
    settings: dict[str, UpdateSettings]
    generator_seeds: dict[AgentID, int] | None


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

    def install(
        self,
        policies: Mapping[AgentID, ActorCriticPolicy],
        return_normalizers: Mapping[AgentID, ReturnNormalizer] | None,
    ) -> None:
        """Load the trained weights, optimizer states and return statistics into the model's ``policies`` and
        ``return_normalizers`` (under the same agents), in place."""
        for agent, state in self.policy_states.items():
            policies[agent].load_state_dict(arrays_to_tensors(state))
            policies[agent].optimizer.load_state_dict(arrays_to_tensors(self.optimizer_states[agent]))
        if return_normalizers is not None and self.return_normalizers is not None:
            for agent, trained in self.return_normalizers.items():
                return_normalizers[agent].__dict__.update(trained.__dict__)


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
    """Runs updates with ``runners`` (one per agent group, in the model's order), changing their policies, optimizers
    and ``return_normalizers`` in place."""

    runners: list[GroupRunner]
    return_normalizers: dict[AgentID, ReturnNormalizer] | None

    def update(self, job: UpdateJob) -> dict[AgentID, UpdateStats]:
        """Every group's update on the job's trajectories; ``{agent: statistics}`` for the agents that had any."""
        stats: dict[AgentID, UpdateStats] = {}
        for runner in self.runners:
            stats.update(
                runner.update(
                    job.trajectories,
                    job.settings[runner.name],
                    job.obs_normalizers,
                    self.return_normalizers,
                    job.generator_seeds,
                )
            )
        return stats

    def result(self, stats: dict[AgentID, UpdateStats]) -> UpdateResult:
        """The weights and optimizer state of every policy this update trained (a shared one once)."""
        policies = {agent: policy for runner in self.runners for agent, policy in runner.policies.items()}
        trained: dict[int, AgentID] = {}
        for agent in stats:
            trained.setdefault(id(policies[agent]), agent)
        return UpdateResult(
            stats=stats,
            policy_states={agent: tensors_to_arrays(policies[agent].state_dict()) for agent in trained.values()},
            optimizer_states={agent: tensors_to_arrays(policies[agent].optimizer.state_dict()) for agent in trained.values()},
            return_normalizers=self.return_normalizers,
        )
