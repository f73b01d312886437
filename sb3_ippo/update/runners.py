"""One object per agent group that decides how its members act and train: the group runner.

A group's members act and train in one of three ways, decided once when the model is set up:

- **shared**: ``share_parameters=True``; one policy under every member's id, acting on all their rows at once and
  trained on all their trajectories as one batch;
- **stacked**: independent networks evaluated and trained as one batch (``batched=True``,
  :mod:`sb3_ippo.update.stacked`), where the members' architecture allows it;
- **one at a time**: the reference path (``batched=False``, one member, masked policies, or an architecture that
  cannot be stacked).

Acting (``IPPO.collect_rollouts``) and training (:class:`sb3_ippo.update.trainer.Trainer`) both ask the runner, so the
dispatch is written once. Runners are pickled into the learner process with the trainer; the stacked view is rebuilt
there from the unpickled policies.
"""

from __future__ import annotations

import contextlib
import functools
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import torch as th
from gymnasium import spaces
from stable_baselines3.common.distributions import StateDependentNoiseDistribution
from stable_baselines3.common.policies import ActorCriticPolicy
from stable_baselines3.common.utils import obs_as_tensor, update_learning_rate

from sb3_ippo.common.buffer import Trajectory
from sb3_ippo.common.groups import AgentGroup, same_spaces
from sb3_ippo.games.masking import MaskedInputMixin
from sb3_ippo.common.normalization import ObservationNormalizer, ReturnNormalizer
from sb3_ippo.common.preprocessing import to_policy_observation
from sb3_ippo.common.type_aliases import AgentID, ObsArray
from sb3_ippo.update.batch import TensorObs, build_batch
from sb3_ippo.update.ppo import UpdateStats, ppo_update
from sb3_ippo.update.settings import UpdateSettings
from sb3_ippo.update.stacked import StackedPolicies, concat_tensor_obs, stack_tensor_obs, why_not_stackable
from sb3_ippo.update.stacked_update import stacked_build_batch, stacked_ppo_update

# What acting gives each agent: actions, values (on the value head's scale) and log-probs, one row per env copy.
ActOutput = tuple[th.Tensor, th.Tensor, th.Tensor]


def policy_input(obs: ObsArray, observation_space: spaces.Space, obs_normalizer: ObservationNormalizer | None) -> ObsArray:
    """Raw observations (single or batched) as an agent's policy takes them: normalized with ``obs_normalizer``'s
    statistics (frozen here), if any, images channel-first."""
    if obs_normalizer is not None:
        obs = obs_normalizer.normalize(obs)
    return to_policy_observation(obs, observation_space)


class GroupRunner:
    """How one agent group acts and trains (see the module docstring).

    :param group: The group: its name, agents and whether they share one policy.
    :param policies: ``{agent: policy}`` for its agents (one object under every agent when ``share_parameters``).
    :param observation_spaces: Its agents' observation spaces, as the env gives them.
    :param action_spaces: Its agents' action spaces.
    :param batched: Stack the members' networks where they allow it; where they do not, warn and train them one at
        a time.
    """

    def __init__(
        self,
        group: AgentGroup,
        policies: Mapping[AgentID, ActorCriticPolicy],
        observation_spaces: Mapping[AgentID, spaces.Space],
        action_spaces: Mapping[AgentID, spaces.Space],
        batched: bool,
    ) -> None:
        self.name = group.name
        self.agents = list(group.agents)
        self.policies = {agent: policies[agent] for agent in self.agents}
        self.observation_spaces = {agent: observation_spaces[agent] for agent in self.agents}
        self.share_parameters = group.share_parameters
        self.stacked = self._stack(group, action_spaces) if batched else None

    def _stack(self, group: AgentGroup, action_spaces: Mapping[AgentID, spaces.Space]) -> StackedPolicies | None:
        """The members' networks stacked, or None where stacking does not apply (one member, shared parameters, masked
        policies) or cannot (with a warning saying why)."""
        policies = list(self.policies.values())
        if len(policies) < 2 or self.share_parameters:
            return None
        if any(isinstance(policy, MaskedInputMixin) for policy in policies):
            return None  # Masked groups take the reference path (stacked.py has no maskable distributions).
        reason = why_not_stackable(policies)
        if reason is None and not same_spaces(group, self.observation_spaces, action_spaces):
            reason = "its agents' spaces differ"
        if reason is not None:
            warnings.warn(f"Group {self.name!r} is trained one agent at a time (batched=False): {reason}", stacklevel=5)
            return None
        return StackedPolicies(policies)

    def __getstate__(self) -> dict[str, Any]:
        # The stacked view holds a functional copy of the modules: it is rebuilt from the unpickled policies.
        return {**self.__dict__, "stacked": self.stacked is not None}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.stacked = StackedPolicies(list(self.policies.values())) if state["stacked"] else None

    def policy_input(
        self, agent: AgentID, obs: ObsArray, obs_normalizers: Mapping[AgentID, ObservationNormalizer] | None
    ) -> ObsArray:
        """:func:`policy_input` of one member, with its normalizer in ``obs_normalizers`` (None: no normalization)."""
        return policy_input(obs, self.observation_spaces[agent], None if obs_normalizers is None else obs_normalizers[agent])

    # --------------------------------------------------------------------------------------------------------------
    # Acting
    # --------------------------------------------------------------------------------------------------------------

    @th.no_grad()
    def act(
        self,
        obs: Mapping[AgentID, ObsArray],
        acting: Sequence[AgentID],
        obs_normalizers: Mapping[AgentID, ObservationNormalizer] | None,
        acted: Mapping[AgentID, np.ndarray] | None = None,
    ) -> dict[AgentID, ActOutput]:
        """Sample actions for every row of each acting member's raw observations ``obs[agent]``: ``{agent: (actions,
        values, log-probs)}``. One forward call for a stacked or shared group, one per member otherwise; the random
        draws are those of the one-at-a-time path either way. ``acted`` (which rows each member acts in) matters only
        to runners that keep state (``sb3_ippo.update.recurrent``)."""
        members = [agent for agent in self.agents if agent in acting]
        if not members:
            return {}
        device = self.policies[members[0]].device

        def as_input(agent: AgentID) -> TensorObs:
            return obs_as_tensor(self.policy_input(agent, obs[agent], obs_normalizers), device)  # type: ignore[arg-type]

        if self.stacked is not None:
            # Every member's rows go in (an absent member's are ignored): the stacked shapes stay fixed.
            inputs = stack_tensor_obs([as_input(agent) for agent in self.agents])
            indices = [self.agents.index(agent) for agent in members]
            return dict(zip(members, self.stacked.act(self.stacked.gather(), inputs, indices), strict=True))
        with self.members_noise(members):
            if self.share_parameters and len(members) > 1:
                actions, values, log_probs = self.policies[members[0]](concat_tensor_obs([as_input(a) for a in members]))
                rows = [len(actions) // len(members)] * len(members)
                outputs = zip(actions.split(rows), values.split(rows), log_probs.split(rows), strict=True)
                return dict(zip(members, outputs, strict=True))
            return {agent: self.policies[agent](as_input(agent)) for agent in members}

    # --------------------------------------------------------------------------------------------------------------
    # gSDE exploration noise
    # --------------------------------------------------------------------------------------------------------------

    def reset_noise(self, n_envs: int) -> None:
        """Draw new gSDE exploration matrices (SB3's ``policy.reset_noise(n_envs)``) for the members whose policy uses
        gSDE, from its current standard deviation: one per env copy, and per member for a policy the members share (its
        rows member after member, as :meth:`act` lays them out). Other policies are left alone."""
        for policy in {id(policy): policy for policy in self.policies.values()}.values():
            if isinstance(policy.action_dist, StateDependentNoiseDistribution):
                # Without a graph to log_std, unlike SB3's: the matrices must deep-copy (self-play snapshots) and pickle
                # (the learner process), and no loss reads them (gSDE's log-prob depends on the std, not the draw).
                with th.no_grad():
                    policy.reset_noise(n_envs * (len(self.agents) if self.share_parameters else 1))

    @contextlib.contextmanager
    def members_noise(self, members: Sequence[AgentID]) -> Iterator[None]:
        """While a policy shared by the group acts for ``members`` (in group order) on their rows laid end to end, its
        gSDE exploration matrices are theirs: each member explores with its own, whichever members act. Elsewhere
        (own policies, no gSDE) this does nothing."""
        policy = self.policies[self.agents[0]]
        distribution = policy.action_dist
        if not self.share_parameters or not isinstance(distribution, StateDependentNoiseDistribution):
            yield
            return
        every = distribution.exploration_matrices
        n_rows = len(every) // len(self.agents)
        indices = [self.agents.index(agent) for agent in members]
        distribution.exploration_matrices = th.cat([every[i * n_rows : (i + 1) * n_rows] for i in indices])
        try:
            yield
        finally:
            distribution.exploration_matrices = every

    # --------------------------------------------------------------------------------------------------------------
    # Training
    # --------------------------------------------------------------------------------------------------------------

    def update(
        self,
        trajectories: Mapping[AgentID, list[Trajectory]],
        settings: UpdateSettings,
        obs_normalizers: Mapping[AgentID, ObservationNormalizer] | None,
        return_normalizers: Mapping[AgentID, ReturnNormalizer] | None,
        generator_seeds: Mapping[AgentID, int] | None,
    ) -> dict[AgentID, UpdateStats]:
        """Each member's batch (fresh values and log-probs, GAE) and PPO update, with ``settings`` (schedules read):
        stacked members together, a shared policy on all its agents' trajectories, other members one at a time.
        Members without trajectories are left alone."""
        for policy in {id(policy): policy for policy in self.policies.values()}.values():
            update_learning_rate(policy.optimizer, settings.learning_rate)  # type: ignore[arg-type]
        agents = [agent for agent in self.agents if agent in trajectories]
        if not agents:
            return {}

        def preprocess(agent: AgentID) -> functools.partial[ObsArray]:
            return functools.partial(self.policy_input, agent, obs_normalizers=obs_normalizers)

        def return_normalizer(agent: AgentID) -> ReturnNormalizer | None:
            return None if return_normalizers is None else return_normalizers[agent]

        def generator(agent: AgentID) -> th.Generator | None:
            return None if generator_seeds is None else th.Generator().manual_seed(generator_seeds[agent])

        def update_one(agent: AgentID, batch_trajectories: list[Trajectory]) -> UpdateStats:
            return self.update_member(
                agent, batch_trajectories, settings, preprocess(agent), return_normalizer(agent), generator(agent)
            )

        if self.share_parameters:
            # One policy: all its agents' trajectories, normalized by the group's shared normalizer, are one batch.
            shared = update_one(agents[0], [t for agent in agents for t in trajectories[agent]])
            return dict.fromkeys(agents, shared)
        if self.stacked is None or len(agents) < 2:
            return {agent: update_one(agent, trajectories[agent]) for agent in agents}
        stacked = self.stacked if len(agents) == len(self.agents) else StackedPolicies([self.policies[a] for a in agents])
        batch = stacked_build_batch(
            stacked,
            [trajectories[agent] for agent in agents],
            settings,
            [preprocess(agent) for agent in agents],
            None if return_normalizers is None else [return_normalizers[agent] for agent in agents],
        )
        generators = None if generator_seeds is None else [generator(agent) for agent in agents]
        return dict(zip(agents, stacked_ppo_update(stacked, batch, settings, generators), strict=True))

    def update_member(
        self,
        agent: AgentID,
        trajectories: list[Trajectory],
        settings: UpdateSettings,
        preprocess: Callable[[ObsArray], ObsArray],
        return_normalizer: ReturnNormalizer | None,
        generator: th.Generator | None,
    ) -> UpdateStats:
        """One member's batch and PPO update on the reference path (a shared policy's: on all its agents'
        trajectories); runners of other kinds of policies build and train their batches their own way here."""
        policy = self.policies[agent]
        batch = build_batch(policy, trajectories, settings, preprocess, return_normalizer)
        return ppo_update(policy, batch, settings, generator)
