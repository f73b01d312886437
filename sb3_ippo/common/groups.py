"""Agent groups: which agents are trained together, whether they share one network, and their own settings.

Agents whose observation space, action space and policy settings are identical form a group, named by their common
id prefix (``adversary_0`` -> ``adversary``); or the user names the groups. A group's members keep their own
weights, optimizer, buffer and normalizers (independent PPO), and are evaluated and trained as one batch
(:mod:`sb3_ippo.update.stacked`); with ``share_parameters`` they use one policy trained on all their trajectories.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gymnasium import spaces

from sb3_ippo.common.type_aliases import AgentID
from sb3_ippo.update.settings import UPDATE_SETTINGS

# The settings ``group_kwargs`` may give a group: every update setting (``UpdateSettings``' fields), and its policy.
GROUP_POLICY_SETTINGS = ("policy", "policy_kwargs")


@dataclass
class AgentGroup:
    """A group's members and what it sets for them.

    :param name: The group's name.
    :param agents: Its agent ids, in the env's order.
    :param share_parameters: The members use one policy, trained on all their trajectories.
    :param settings: Hyperparameters and ``policy`` / ``policy_kwargs`` that differ from the model's.
    """

    name: str
    agents: list[AgentID]
    share_parameters: bool = False
    settings: dict[str, Any] = field(default_factory=dict)


def id_prefix(agent: AgentID) -> str:
    """The kind of agent an id names: its text before a trailing number (``agent_0`` -> ``agent``)."""
    return re.sub(r"[_\-]?\d+$", "", str(agent)) or str(agent)


def automatic_groups(
    agents: Sequence[AgentID],
    observation_spaces: Mapping[AgentID, spaces.Space],
    action_spaces: Mapping[AgentID, spaces.Space],
) -> dict[str, list[AgentID]]:
    """Agents with the same id prefix and the same spaces, named by the prefix (``prefix_1``, ... where one prefix
    covers several kinds of spaces)."""
    kinds: dict[tuple[str, int], list[AgentID]] = {}
    representatives: dict[str, list[AgentID]] = {}
    for agent in agents:
        prefix = id_prefix(agent)
        same_prefix = representatives.setdefault(prefix, [])
        for index, other in enumerate(same_prefix):
            if observation_spaces[other] == observation_spaces[agent] and action_spaces[other] == action_spaces[agent]:
                kinds[(prefix, index)].append(agent)
                break
        else:
            kinds[(prefix, len(same_prefix))] = [agent]
            same_prefix.append(agent)
    taken = set(representatives)
    names: dict[str, list[AgentID]] = {}
    for (prefix, index), members in kinds.items():
        name = prefix
        if index > 0:
            name = f"{prefix}_{index}"
            while name in taken or name in names:
                name += "_"
        names[name] = members
    return names


def make_groups(
    agents: Sequence[AgentID],
    observation_spaces: Mapping[AgentID, spaces.Space],
    action_spaces: Mapping[AgentID, spaces.Space],
    groups: Mapping[str, Sequence[AgentID]] | None = None,
    share_parameters: bool | Mapping[str, bool] = False,
    group_kwargs: Mapping[str, Mapping[str, Any]] | None = None,
) -> dict[str, AgentGroup]:
    """The model's groups, in the order of their first agent.

    :param groups: ``{name: [agent ids]}``; agents it leaves out are grouped automatically. None: all automatic.
    :param share_parameters: For every group, or ``{group name: bool}`` (unnamed groups: False).
    :param group_kwargs: ``{group name: {setting: value}}``, settings from ``UPDATE_SETTINGS`` and
        :data:`GROUP_POLICY_SETTINGS`.
    :raises ValueError: for an unknown or repeated agent, an unknown group name or setting, or a group that shares
        parameters across different spaces.
    """
    members = _user_groups(agents, groups)
    grouped = {agent for group in members.values() for agent in group}
    left = [agent for agent in agents if agent not in grouped]
    for name, group in automatic_groups(left, observation_spaces, action_spaces).items():
        while name in members:
            name += "_"
        members[name] = group
    order = {agent: index for index, agent in enumerate(agents)}
    members = dict(sorted(members.items(), key=lambda item: order[item[1][0]]))

    if isinstance(share_parameters, Mapping):
        _check_names("share_parameters", share_parameters, members)
        shared = {name: bool(share_parameters.get(name, False)) for name in members}
    elif isinstance(share_parameters, bool):
        shared = dict.fromkeys(members, share_parameters)
    else:
        raise ValueError(f"share_parameters must be a bool or a dict {{group name: bool}}, got {share_parameters!r}")
    group_kwargs = group_kwargs or {}
    _check_names("group_kwargs", group_kwargs, members)
    allowed = UPDATE_SETTINGS + GROUP_POLICY_SETTINGS
    for name, settings in group_kwargs.items():
        unknown = [key for key in settings if key not in allowed]
        if unknown:
            raise ValueError(f"group_kwargs[{name!r}] has unknown settings {unknown}; a group may set {list(allowed)}")

    result = {}
    for name, group in members.items():
        result[name] = AgentGroup(name, list(group), shared[name], dict(group_kwargs.get(name, {})))
        if shared[name] and not same_spaces(result[name], observation_spaces, action_spaces):
            raise ValueError(
                f"Group {name!r} shares parameters, but its agents {group} do not all have the same observation and "
                "action spaces: agents sharing one network need the same spaces"
            )
    return result


def same_spaces(
    group: AgentGroup, observation_spaces: Mapping[AgentID, spaces.Space], action_spaces: Mapping[AgentID, spaces.Space]
) -> bool:
    """Whether every member of ``group`` has the first member's spaces (a condition for stacking them)."""
    first = group.agents[0]
    return all(
        observation_spaces[agent] == observation_spaces[first] and action_spaces[agent] == action_spaces[first]
        for agent in group.agents
    )


def _user_groups(agents: Sequence[AgentID], groups: Mapping[str, Sequence[AgentID]] | None) -> dict[str, list[AgentID]]:
    if groups is None:
        return {}
    if not isinstance(groups, Mapping):
        raise ValueError(f"groups must be a dict {{group name: [agent ids]}}, got {groups!r}")
    seen: dict[AgentID, str] = {}
    result = {}
    for name, group in groups.items():
        if isinstance(group, str) or not isinstance(group, Sequence) or not group:
            raise ValueError(f"groups[{name!r}] must be a non-empty list of agent ids, got {group!r}")
        for agent in group:
            if agent not in agents:
                raise ValueError(f"groups[{name!r}] names agent {agent!r}, which the env does not have: {list(agents)}")
            if agent in seen:
                raise ValueError(f"Agent {agent!r} is in two groups: {seen[agent]!r} and {name!r}")
            seen[agent] = name
        result[str(name)] = list(group)
    return result


def _check_names(what: str, given: Mapping[str, Any], groups: Mapping[str, Any]) -> None:
    unknown = [name for name in given if name not in groups]
    if unknown:
        raise ValueError(f"{what} names unknown groups {unknown}; the groups are {list(groups)}")
