"""Exporting one MAPPO agent's actor as a plain SB3 ``PPO`` on the agent's own observation space
(``MAPPO.export_agent``): the centralized critic stays behind."""

from __future__ import annotations

import io
import pathlib
from typing import TYPE_CHECKING

import torch as th
from stable_baselines3 import PPO

from sb3_ippo.critic_input import OBS_KEY
from sb3_ippo.export import fold_observation_normalization, ppo_hyperparameters
from sb3_ippo.normalization import ObservationNormalizer
from sb3_ippo.types import AgentID

if TYPE_CHECKING:
    from sb3_ippo.mappo.mappo import MAPPO


def export_actor(model: MAPPO, agent_id: AgentID, path: str | pathlib.Path | io.BufferedIOBase) -> None:
    """See ``MAPPO.export_agent``."""
    if agent_id not in model._policy_keys:
        raise KeyError(f"Unknown agent id {agent_id!r}: the model's agents are {model.possible_agents}")
    policy = model.policies[agent_id]
    group = model._agent_groups[model._group_of[agent_id]]
    settings = model._update_settings[group.name]
    policy_kwargs = dict(group.settings.get("policy_kwargs", model.policy_kwargs) or {})
    policy_kwargs.pop("features_extractor_class", None)
    policy_kwargs.pop("features_extractor_kwargs", None)
    ppo = PPO(
        "MlpPolicy",
        env=None,  # type: ignore[arg-type]
        **ppo_hyperparameters(model, settings),
        policy_kwargs=policy_kwargs,
        _init_setup_model=False,
    )
    ppo.observation_space = model.observation_spaces[agent_id][OBS_KEY]  # type: ignore[index]
    ppo.action_space = model.action_spaces[agent_id]
    ppo.n_envs = 1
    ppo.num_timesteps = model.num_timesteps
    ppo._setup_model()
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
        rms = model.obs_normalizers[agent_id].obs_rms
        own = ObservationNormalizer(ppo.observation_space)
        own.obs_rms = rms[OBS_KEY] if isinstance(rms, dict) else None
        own.epsilon = model.obs_normalizers[agent_id].epsilon
        fold_observation_normalization(exported, own)
    ppo.save(path)
