"""MAPPO's policy: SB3's actor-critic, whose actor reads only the agent's own observation and whose critic reads only
the centralized input (:mod:`sb3_ippo.common.critic_input`).

The observation of a MAPPO policy is ``{"obs": own observation, "critic": critic input}``. The features extractor lays
both end to end, flattened, own observation first; the MLP extractor then gives the actor's network the first part and
the value network the second. So nothing the actor computes depends on the critic input: at acting time (``predict``,
evaluation, an exported agent) the critic input may be anything, zeros included.
"""

from __future__ import annotations

from typing import Any

import torch as th
from gymnasium import spaces
from stable_baselines3.common.policies import MultiInputActorCriticPolicy
from stable_baselines3.common.preprocessing import get_flattened_obs_dim
from stable_baselines3.common.torch_layers import BaseFeaturesExtractor
from torch import nn

from sb3_ippo.common.critic_input import CRITIC_KEY, OBS_KEY, has_critic_input
from sb3_ippo.serialization.encoding import allow_class


class CriticInputExtractor(BaseFeaturesExtractor):
    """The flattened own observation, then the flattened critic input: ``features_dim`` is the sum of their sizes."""

    def __init__(self, observation_space: spaces.Dict) -> None:
        if not has_critic_input(observation_space):
            raise ValueError(
                f"CriticInputExtractor takes the observations of sb3_ippo.common.critic_input.CriticInputWrapper "
                f"({{{OBS_KEY!r}: ..., {CRITIC_KEY!r}: ...}}), got {observation_space}"
            )
        self.actor_dim = get_flattened_obs_dim(observation_space[OBS_KEY])
        self.critic_dim = get_flattened_obs_dim(observation_space[CRITIC_KEY])
        super().__init__(observation_space, self.actor_dim + self.critic_dim)
        self.flatten = nn.Flatten()

    def forward(self, observations: dict[str, th.Tensor]) -> th.Tensor:  # type: ignore[override]
        return th.cat([self.flatten(observations[OBS_KEY]), self.flatten(observations[CRITIC_KEY])], dim=1)


def _mlp(in_dim: int, sizes: list[int], activation_fn: type[nn.Module]) -> tuple[nn.Sequential, int]:
    layers: list[nn.Module] = []
    for size in sizes:
        layers += [nn.Linear(in_dim, size), activation_fn()]
        in_dim = size
    return nn.Sequential(*layers), in_dim


class CentralCriticMlpExtractor(nn.Module):
    """SB3's ``MlpExtractor`` (``net_arch`` as a list, or ``dict(pi=[...], vf=[...])``), but the actor's network
    (``policy_net``) takes the first ``actor_dim`` features (the own observation) and the value network
    (``value_net``) the rest (the critic input)."""

    def __init__(
        self,
        actor_dim: int,
        critic_dim: int,
        net_arch: list[int] | dict[str, list[int]],
        activation_fn: type[nn.Module],
        device: th.device | str = "auto",
    ) -> None:
        super().__init__()
        pi_sizes, vf_sizes = (
            (net_arch.get("pi", []), net_arch.get("vf", [])) if isinstance(net_arch, dict) else (net_arch, net_arch)
        )
        self.actor_dim = actor_dim
        self.policy_net, self.latent_dim_pi = _mlp(actor_dim, list(pi_sizes), activation_fn)
        self.value_net, self.latent_dim_vf = _mlp(critic_dim, list(vf_sizes), activation_fn)

    def forward(self, features: th.Tensor) -> tuple[th.Tensor, th.Tensor]:
        return self.forward_actor(features), self.forward_critic(features)

    def forward_actor(self, features: th.Tensor) -> th.Tensor:
        return self.policy_net(features[:, : self.actor_dim])

    def forward_critic(self, features: th.Tensor) -> th.Tensor:
        return self.value_net(features[:, self.actor_dim :])


class CentralCriticPolicy(MultiInputActorCriticPolicy):
    """SB3's actor-critic policy with a centralized critic: the actor sees the agent's own observation, the critic the
    critic input (see the module docstring). It takes the same keyword arguments as ``MlpPolicy``; the features
    extractor must keep the two parts apart, as :class:`CriticInputExtractor` (the default) does."""

    def __init__(self, observation_space: spaces.Dict, action_space: spaces.Space, lr_schedule: Any, **kwargs: Any) -> None:
        kwargs.setdefault("features_extractor_class", CriticInputExtractor)
        super().__init__(observation_space, action_space, lr_schedule, **kwargs)

    def _build_mlp_extractor(self) -> None:
        extractor = self.features_extractor
        if not isinstance(extractor, CriticInputExtractor):
            raise ValueError(
                f"CentralCriticPolicy needs a features extractor that keeps the own observation and the critic input "
                f"apart (CriticInputExtractor), got {type(extractor).__name__}"
            )
        self.mlp_extractor = CentralCriticMlpExtractor(  # type: ignore[assignment]
            extractor.actor_dim, extractor.critic_dim, self.net_arch, self.activation_fn, self.device
        )


MlpPolicy = CentralCriticPolicy

# Safe model files (safetensors, zips loaded with trusted=False) may name these classes.
allow_class(CentralCriticPolicy)
allow_class(CriticInputExtractor)
