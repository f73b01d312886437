"""Every agent's policy network, built per group: one network per member, or one shared by all the members of a group
that shares parameters, of the group's policy class (a masked agent gets sb3-contrib's maskable counterpart)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch as th
from gymnasium import spaces
from stable_baselines3.common.distributions import DiagGaussianDistribution
from stable_baselines3.common.policies import ActorCriticPolicy, BasePolicy
from stable_baselines3.common.type_aliases import Schedule

from sb3_ippo.common.checks import check_policy_fits
from sb3_ippo.common.groups import AgentGroup
from sb3_ippo.games.masking import policy_for_agent
from sb3_ippo.common.preprocessing import policy_observation_space
from sb3_ippo.common.type_aliases import AgentID


def initial_log_std(action_space: spaces.Box) -> th.Tensor:
    """The initial log std of a Gaussian policy on ``action_space``, one per action dimension: SB3's std of 1, except
    that it is never wider than half the dimension's range (mpe2's [0, 1]: 0.5). On the [-1, 1] that SB3 asks
    continuous actions to be scaled to, on wider and unbounded dimensions, and on a dimension of one value, it is
    SB3's."""
    half_range = (action_space.high.astype(np.float64) - action_space.low.astype(np.float64)) / 2
    std = np.where(half_range > 0, np.minimum(half_range, 1.0), 1.0)
    return th.as_tensor(np.log(std), dtype=th.float32).flatten()


def start_from_the_action_range(policy: BasePolicy, action_space: spaces.Space, policy_kwargs: Mapping[str, Any]) -> None:
    """Set a new Gaussian policy's log std on Box actions to :func:`initial_log_std`, where ``policy_kwargs`` does not
    set ``log_std_init``. gSDE's std is a matrix of its own and keeps SB3's initial value; other distributions have
    no std."""
    log_std = getattr(policy, "log_std", None)
    if (
        "log_std_init" in policy_kwargs
        or not isinstance(action_space, spaces.Box)
        or not isinstance(getattr(policy, "action_dist", None), DiagGaussianDistribution)
        or not isinstance(log_std, th.nn.Parameter)
    ):
        return
    with th.no_grad():
        log_std.copy_(initial_log_std(action_space))


def module_keys(agent_ids: list[AgentID]) -> dict[AgentID, str]:
    """Keys that ``nn.ModuleDict`` and SB3's dotted save names accept, one per agent id, unique and readable."""
    keys: dict[AgentID, str] = {}
    for index, agent in enumerate(agent_ids):
        key = "agent_" + re.sub(r"\W", "_", str(agent))
        if key in keys.values():
            key = f"{key}_{index}"
        keys[agent] = key
    return keys


def group_policy_class(
    group: AgentGroup, default: type[ActorCriticPolicy], aliases: Mapping[str, type[BasePolicy]]
) -> type[ActorCriticPolicy]:
    """The policy class of ``group``: its own (``group_kwargs``'s ``policy``, a class or one of ``aliases``), else
    ``default``.

    :raises ValueError: for an unknown alias.
    :raises TypeError: for a class that is not an ``ActorCriticPolicy``.
    """
    policy = group.settings.get("policy")
    if policy is None:
        return default
    if isinstance(policy, str):
        if policy not in aliases:
            raise ValueError(
                f"group_kwargs[{group.name!r}]['policy'] is {policy!r}: use one of {list(aliases)} or an "
                "ActorCriticPolicy subclass"
            )
        return aliases[policy]  # type: ignore[return-value]
    if not (isinstance(policy, type) and issubclass(policy, ActorCriticPolicy)):
        raise TypeError(f"group_kwargs[{group.name!r}]['policy'] must be an ActorCriticPolicy subclass, got {policy!r}")
    return policy


def make_group_policies(
    group: AgentGroup,
    policy_class: type[ActorCriticPolicy],
    observation_spaces: Mapping[AgentID, spaces.Space],
    action_spaces: Mapping[AgentID, spaces.Space],
    lr_schedule: Schedule,
    policy_kwargs: Mapping[str, Any],
    device: th.device,
) -> dict[AgentID, ActorCriticPolicy]:
    """``{agent: policy}`` for the group's members: a new policy each, or one for all with ``share_parameters``.

    :raises ValueError: where ``policy_class`` cannot take an agent's observations, naming the agent and the fix; for
        gSDE (``use_sde``) on an agent whose actions are not a Box.
    """
    policies: dict[AgentID, ActorCriticPolicy] = {}
    shared = None
    for agent in group.agents:
        if policy_kwargs.get("use_sde") and not isinstance(action_spaces[agent], spaces.Box):
            raise ValueError(
                f"Agent {agent!r} has the action space {action_spaces[agent]}: gSDE (use_sde=True) needs continuous "
                "(Box) actions, as in SB3. To use it for some agents only, set it for their group: "
                "group_kwargs={group: dict(policy_kwargs=dict(use_sde=True))}"
            )
        # A masked agent (an action_mask in its observation) gets sb3-contrib's maskable policy (masking.py).
        agent_class, agent_space = policy_for_agent(agent, policy_class, observation_spaces[agent], action_spaces[agent])
        if agent_class is policy_class:
            check_policy_fits(agent, policy_class, observation_spaces[agent])
        if shared is None or not group.share_parameters:
            try:
                shared = agent_class(  # type: ignore[call-arg]
                    policy_observation_space(agent_space), action_spaces[agent], lr_schedule, **policy_kwargs
                ).to(device)
            except AssertionError as error:
                if "NatureCNN" not in str(error):
                    raise
                raise ValueError(
                    f"Agent {agent!r} has the observation space {observation_spaces[agent]}, not an image: "
                    f"{policy_class.__name__} ('CnnPolicy') needs images (uint8, values 0-255, height x width x "
                    "channels); use 'MlpPolicy' for vector observations (for one group of agents only: "
                    "group_kwargs={group: dict(policy=...)})"
                ) from error
            start_from_the_action_range(shared, action_spaces[agent], policy_kwargs)
        policies[agent] = shared  # type: ignore[assignment]
    return policies
