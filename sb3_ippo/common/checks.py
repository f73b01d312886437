"""The checks of what a model is given: the env's agents and spaces, and the policy class each agent gets. Each error
names the agent and says what to do."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from gymnasium import spaces
from sb3_contrib.common.recurrent.policies import RecurrentMultiInputActorCriticPolicy
from stable_baselines3.common.policies import BasePolicy, MultiInputActorCriticPolicy

from sb3_ippo.common.type_aliases import AgentID
from sb3_ippo.vec_env import MultiAgentVecEnv

# The spaces SB3's policies take, as actions, and as observations (also inside a Dict).
SPACE_KINDS = (spaces.Box, spaces.Discrete, spaces.MultiDiscrete, spaces.MultiBinary)


def check_agent_spaces(observation_spaces: Mapping[Any, spaces.Space], action_spaces: Mapping[Any, spaces.Space]) -> None:
    """:raises ValueError: for agent ids that are not strings, and for spaces SB3's policies cannot take, naming the agent
    and what to do."""
    not_strings = [agent for agent in observation_spaces if not isinstance(agent, str)]
    if not_strings:
        raise ValueError(
            f"The env's agent ids {not_strings} are not strings: IPPO names each agent's policy, logger keys and "
            "entries of the model file by its id. Rename the agents in a wrapper of the env (e.g. str(agent))."
        )
    for agent, space in observation_spaces.items():
        subspaces = space.spaces.values() if isinstance(space, spaces.Dict) else [space]
        if not all(isinstance(subspace, SPACE_KINDS) for subspace in subspaces):
            raise ValueError(
                f"Agent {agent!r} has the observation space {space}, which SB3's policies cannot take: "
                "IPPO supports Box, Discrete, MultiDiscrete and MultiBinary observations, and Dict spaces of them. "
                "Flatten or convert the observations in a wrapper of the env (e.g. a Tuple into a Dict or one Box)."
            )
        if any(isinstance(subspace, spaces.Box) and subspace.shape == () for subspace in subspaces):
            raise ValueError(
                f"Agent {agent!r} has a Box observation space of shape () ({space}), which SB3's policies cannot "
                "take: give the observation shape (1,) in a wrapper of the env (np.reshape(obs, (1,)))."
            )
    for agent, action_space in action_spaces.items():
        if not isinstance(action_space, SPACE_KINDS):
            raise ValueError(
                f"Agent {agent!r} has action space {action_space}; "
                "IPPO supports Box, Discrete, MultiDiscrete and MultiBinary action spaces"
            )
        if isinstance(action_space, spaces.Box) and not np.all(np.isfinite([action_space.low, action_space.high])):
            raise ValueError(f"Agent {agent!r} has a Box action space with infinite bounds: {action_space}")


def check_policy_fits(agent: AgentID, policy_class: type[BasePolicy], observation_space: spaces.Space) -> None:
    """:raises ValueError: where ``policy_class`` cannot take the agent's observations (Dict or not), with the fix."""
    policy_name = policy_class.__name__
    fix = "(for one group of agents only: group_kwargs={group: dict(policy=...)})"
    multi_input = issubclass(policy_class, (MultiInputActorCriticPolicy, RecurrentMultiInputActorCriticPolicy))
    if isinstance(observation_space, spaces.Dict) and not multi_input:
        raise ValueError(
            f"Agent {agent!r} has a Dict observation space: use 'MultiInputPolicy' (or 'MultiInputLstmPolicy'), not "
            f"{policy_name} {fix}"
        )
    if multi_input and not isinstance(observation_space, spaces.Dict):
        # Otherwise SB3's CombinedExtractor fails with an AttributeError on the space.
        raise ValueError(
            f"Agent {agent!r} has the observation space {observation_space}, not a Dict: {policy_name} "
            f"('MultiInputPolicy') needs Dict observations {fix}"
        )


def check_env_matches(
    possible_agents: Sequence[AgentID],
    observation_spaces: Mapping[AgentID, spaces.Space],
    action_spaces: Mapping[AgentID, spaces.Space],
    env: MultiAgentVecEnv,
) -> None:
    """:raises ValueError: naming the first agent whose id or spaces in ``env`` differ from the model's."""
    if list(env.possible_agents) != list(possible_agents):
        missing = [agent for agent in possible_agents if agent not in env.possible_agents]
        extra = [agent for agent in env.possible_agents if agent not in possible_agents]
        culprit = next(iter(missing + extra), None)
        raise ValueError(
            f"The env's agents differ from the model's at agent {culprit!r}: the model has {possible_agents}, "
            f"the env has {list(env.possible_agents)}"
        )
    for agent in possible_agents:
        for kind, model_space, env_space in (
            ("observation", observation_spaces[agent], env.observation_spaces[agent]),
            ("action", action_spaces[agent], env.action_spaces[agent]),
        ):
            if model_space != env_space:
                raise ValueError(
                    f"Agent {agent!r}: the env's {kind} space {env_space} differs from the model's {model_space}"
                )


def no_update_message(
    steps: int,
    policy_version: int,
    n_steps: int | None,
    n_episodes: int | None,
    counts: Sequence[tuple[int, int]],
    rollout_len: int | None = None,
) -> str:
    """What to say when ``learn`` spent ``steps`` env steps without a single update, and what would give one.

    :param n_steps: The transitions per agent an update takes (``rollout_len * n_envs`` under ``rollout_len``'s rule).
    :param counts: Each agent that acted: its fresh finished trajectories and their transitions (``fresh_counts``).
    :param rollout_len: Set when ``n_steps`` comes from ``rollout_len`` (the user set no ``n_steps``).
    """
    if n_steps is not None:
        trigger, wanted, column, unit = "n_steps", n_steps, 1, "transitions in finished trajectories"
    else:
        trigger, wanted, column, unit = "n_episodes", n_episodes or 0, 0, "finished trajectories"
    have = min((count[column] for count in counts), default=0)
    lower = f", or lower {trigger}" if wanted > 1 else ""
    if rollout_len is not None:
        trigger, lower = f"rollout_len={rollout_len} x the env copies: n_steps", ", or lower rollout_len"
    if have > 0:
        advice = (
            f"About {-(-steps * wanted // have)} env steps would give one: raise total_timesteps (or call learn "
            f"again with reset_num_timesteps=False){lower}."
        )
    elif rollout_len is not None:
        advice = f"No trajectory finished within the budget: raise total_timesteps{lower}."
    else:
        advice = (
            "No trajectory finished within the budget: raise total_timesteps, or cut episodes with "
            f"max_episode_steps or rollout_len{lower}."
        )
    return (
        f"IPPO.learn ended after {steps} env steps without a single update (policy_version is still "
        f"{policy_version}): an update needs {trigger}={wanted} {unit} from every agent that acted, and the "
        f"agent with the fewest has {have}. {advice}"
    )
