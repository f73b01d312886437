"""Exporting one MAPPO agent's actor as a plain SB3 ``PPO`` on the agent's own observation space
(``MAPPO.export_agent``): the centralized critic stays behind."""

from __future__ import annotations

import io
import pathlib
from typing import TYPE_CHECKING

import torch as th
from stable_baselines3 import PPO

from sb3_ippo.common.critic_input import OBS_KEY
from sb3_ippo.common.export import check_agent_id, exported_algorithm, fold_observation_normalization, group_policy_kwargs
from sb3_ippo.common.type_aliases import AgentID

if TYPE_CHECKING:
    from sb3_ippo.common.base_class import MultiAgentBaseAlgorithm


def export_actor(model: MultiAgentBaseAlgorithm, agent_id: AgentID, path: str | pathlib.Path | io.BufferedIOBase) -> None:
    """See ``MAPPO.export_agent``."""
    check_agent_id(model, agent_id)
    policy = model.policies[agent_id]
    policy_kwargs = group_policy_kwargs(model, agent_id)
    policy_kwargs.pop("features_extractor_class", None)
    policy_kwargs.pop("features_extractor_kwargs", None)
    # The actor's own entry as its policy takes it (images channel-first): the exported PPO transposes the env's.
    own_space = policy.observation_space[OBS_KEY]  # type: ignore[index]
    ppo = exported_algorithm(model, agent_id, PPO, "MlpPolicy", own_space, policy_kwargs)
    exported = ppo.policy
    with th.no_grad():
        exported.mlp_extractor.policy_net.load_state_dict(policy.mlp_extractor.policy_net.state_dict())
        exported.action_net.load_state_dict(policy.action_net.state_dict())
        if isinstance(getattr(policy, "log_std", None), th.nn.Parameter):
            exported.log_std.copy_(policy.log_std)
        # No centralized input at deployment: the exported critic predicts 0 until trained.
        exported.value_net.weight.zero_()
        exported.value_net.bias.zero_()
    if model.obs_normalizers is not None:
        fold_observation_normalization(exported, model.obs_normalizers[agent_id].entry(OBS_KEY))
    ppo.save(path)
