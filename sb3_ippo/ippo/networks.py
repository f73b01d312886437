"""Every agent's policy network, built per group: one network per member, or one shared by all the members of a group
that shares parameters, of the group's policy class (a masked agent gets sb3-contrib's maskable counterpart)."""

from __future__ import annotations

import inspect
import re
from collections.abc import Mapping
from typing import Any

import torch as th
from gymnasium import spaces
from stable_baselines3.common.policies import ActorCriticPolicy, BasePolicy
from stable_baselines3.common.type_aliases import Schedule

from sb3_ippo.common.checks import check_policy_fits
from sb3_ippo.common.groups import AgentGroup
from sb3_ippo.games.masking import policy_for_agent
from sb3_ippo.common.preprocessing import policy_observation_space
from sb3_ippo.common.type_aliases import AgentID


# The initial log std of a Gaussian policy on Box actions where the user does not set ``log_std_init``: -0.5, a std of
# 0.61. SB3's 0, a std of 1, is as wide as multiwalker's whole [-1, 1] and twice mpe2's [0, 1], so that many of the
# first policy's actions are clipped to the bounds. Chosen in issue 32 on Box tasks of short and long episodes
# (docs/benchmarks.md, "Box actions start from a Gaussian of std 0.61").
BOX_LOG_STD_INIT = -0.5


def agent_policy_kwargs(
    policy_class: type[BasePolicy], action_space: spaces.Space, policy_kwargs: Mapping[str, Any]
) -> dict[str, Any]:
    """``policy_kwargs`` for one agent's policy: with ``log_std_init=BOX_LOG_STD_INIT`` for a Gaussian over Box
    actions (no gSDE, whose std is a matrix of its own) where the user does not set it and the class takes it."""
    kwargs = dict(policy_kwargs)
    if (
        isinstance(action_space, spaces.Box)
        and not kwargs.get("use_sde")
        and "log_std_init" not in kwargs
        and _takes_keyword(policy_class, "log_std_init")
    ):
        kwargs["log_std_init"] = BOX_LOG_STD_INIT
    return kwargs


def _takes_keyword(policy_class: type, name: str) -> bool:
    """Whether ``policy_class(...)`` takes the keyword ``name``: named by its ``__init__`` or, through ``**kwargs``,
    by the first class up its MRO whose ``__init__`` takes no ``**kwargs``."""
    for klass in policy_class.__mro__:
        if "__init__" not in vars(klass):
            continue
        parameters = inspect.signature(vars(klass)["__init__"]).parameters
        if name in parameters:
            return True
        if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
            return False
    return False


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
                    policy_observation_space(agent_space),
                    action_spaces[agent],
                    lr_schedule,
                    **agent_policy_kwargs(agent_class, action_spaces[agent], policy_kwargs),
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
        policies[agent] = shared  # type: ignore[assignment]
    return policies
