"""Exporting one agent as a plain SB3 ``PPO`` (:func:`export_agent`): the frozen observation normalization folded into
the first layers.

A plain PPO zip has no place for IPPO's observation statistics, and a normalizing module of this package inside it
would make ``PPO.load`` import ``sb3_ippo``. Instead, normalization ``(x - mean) / std`` is affine, and the policy
applies an affine layer first to its features: ``W ((x - mean) / std) + b = (W / std) x + (b - W (mean / std))``. So
the exported policy takes raw observations, with the first ``nn.Linear`` of each of its two heads (actor and critic)
rescaled (for a recurrent policy, the input weights of its LSTMs), and nothing of this package is needed to load it.

One difference remains: IPPO clips normalized observations to ``[-clip_obs, clip_obs]`` (10 standard deviations);
the folded layer does not. Observations within 10 standard deviations of the running mean (in practice, all those
seen in training) give the same actions, up to float rounding; farther ones do not.
"""

from __future__ import annotations

import io
import pathlib
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
import torch as th
from gymnasium import spaces
from sb3_contrib import MaskablePPO, RecurrentPPO
from sb3_contrib.common.recurrent.policies import RecurrentActorCriticPolicy
from stable_baselines3 import PPO
from stable_baselines3.common.on_policy_algorithm import OnPolicyAlgorithm
from stable_baselines3.common.policies import ActorCriticPolicy, BasePolicy
from stable_baselines3.common.preprocessing import get_flattened_obs_dim
from stable_baselines3.common.running_mean_std import RunningMeanStd
from stable_baselines3.common.torch_layers import BaseFeaturesExtractor, CombinedExtractor, FlattenExtractor
from torch import nn

from sb3_ippo.games.masking import MaskedInputMixin, base_maskable_class, unmasked_normalizer
from sb3_ippo.common.normalization import ObservationNormalizer
from sb3_ippo.update.recurrent import is_recurrent
from sb3_ippo.common.type_aliases import AgentID

if TYPE_CHECKING:
    from sb3_ippo.common.base_class import MultiAgentBaseAlgorithm
    from sb3_ippo.update.settings import UpdateSettings


def _feature_affine(
    normalizer: ObservationNormalizer, observation_space: spaces.Space, extractor: BaseFeaturesExtractor
) -> tuple[np.ndarray, np.ndarray]:
    """Per feature of ``extractor``'s output: ``(scale, shift)`` such that the features of normalized observations are
    ``scale * (features of raw observations - shift)`` (scale 1, shift 0 for features that are not normalized).

    :raises ValueError: for a features extractor whose output is not the flattened observation (or, for a Dict
        observation, the concatenation of its entries' features, in order).
    """
    rms = normalizer.obs_rms

    def affine(entry_rms: RunningMeanStd) -> tuple[np.ndarray, np.ndarray]:
        return 1.0 / np.sqrt(entry_rms.var.reshape(-1) + normalizer.epsilon), entry_rms.mean.reshape(-1)

    if isinstance(extractor, FlattenExtractor) and isinstance(rms, RunningMeanStd):
        return affine(rms)
    if isinstance(extractor, CombinedExtractor) and isinstance(rms, dict) and isinstance(observation_space, spaces.Dict):
        scales, shifts = [], []
        for key, sub_extractor in extractor.extractors.items():
            if key in rms:
                if not isinstance(sub_extractor, nn.Flatten):
                    raise ValueError(f"the features extractor of the normalized entry {key!r} is not a nn.Flatten")
                scale, shift = affine(rms[key])
            else:
                size = (
                    sub_extractor.features_dim
                    if isinstance(sub_extractor, BaseFeaturesExtractor)
                    else get_flattened_obs_dim(observation_space[key])
                )
                scale, shift = np.ones(size), np.zeros(size)
            scales.append(scale)
            shifts.append(shift)
        return np.concatenate(scales), np.concatenate(shifts)
    raise ValueError(
        f"its features extractor is a {type(extractor).__name__}: folding the normalization into the first layers "
        "needs SB3's FlattenExtractor (Box observations) or CombinedExtractor (Dict observations)"
    )


def _first_linear(head: nn.Sequential, fallback: nn.Module, name: str) -> nn.Linear:
    """The layer that first sees the features on one head: the MLP's first layer, or the output layer when the MLP
    has no hidden layer."""
    first = head[0] if len(head) > 0 else fallback
    if not isinstance(first, nn.Linear):
        raise ValueError(f"the {name} head does not start with an nn.Linear layer (found {type(first).__name__})")
    return first


@th.no_grad()
def fold_observation_normalization(policy: ActorCriticPolicy, normalizer: ObservationNormalizer) -> None:
    """Rescale ``policy``'s first layers in place so that it takes raw observations where it took observations
    normalized by ``normalizer``'s frozen statistics (but for the clip, see the module docstring).

    :raises ValueError: for a policy whose layout does not allow it (it says which part), with the fix.
    """
    if normalizer.obs_rms is None:
        return  # Nothing of this agent's observations is normalized (images, discrete observations).
    try:
        extractors = {"actor": policy.pi_features_extractor, "critic": policy.vf_features_extractor}
        heads: dict[str, nn.Linear | tuple[th.Tensor, th.Tensor]]
        if is_recurrent(policy):
            heads = dict(recurrent_first_layers(policy))  # type: ignore[arg-type]
        else:
            heads = {
                "actor": _first_linear(policy.mlp_extractor.policy_net, policy.action_net, "actor"),
                "critic": _first_linear(policy.mlp_extractor.value_net, policy.value_net, "critic"),
            }
        affines = {
            name: _feature_affine(normalizer, policy.observation_space, extractor) for name, extractor in extractors.items()
        }
    except (ValueError, AttributeError) as error:
        raise ValueError(
            f"export_agent cannot fold the normalize_obs statistics into this {type(policy).__name__}: {error}. Export "
            "works for SB3's MlpPolicy and MultiInputPolicy (a Linear-first MLP on FlattenExtractor/CombinedExtractor "
            "features); otherwise train with normalize_obs=False, or normalize inside the env."
        ) from error
    for name, layer in heads.items():
        scale, shift = affines[name]
        layer_weight, layer_bias = (layer.weight, layer.bias) if isinstance(layer, nn.Linear) else layer
        assert isinstance(layer_weight, th.Tensor) and isinstance(layer_bias, th.Tensor)
        weight = layer_weight.detach().double().cpu()
        scale_t, shift_t = th.as_tensor(scale, dtype=th.float64), th.as_tensor(shift, dtype=th.float64)
        folded_bias = layer_bias.detach().double().cpu() - weight @ (scale_t * shift_t)
        layer_weight.copy_((weight * scale_t).to(layer_weight.dtype))
        layer_bias.copy_(folded_bias.to(layer_bias.dtype))


def recurrent_first_layers(policy: RecurrentActorCriticPolicy) -> dict[str, tuple[th.Tensor, th.Tensor]]:
    """The (weight, bias) that first see the features of a recurrent policy: its LSTMs' input weights (the actor's, and
    the critic's own LSTM or linear layer; a critic that reuses the actor's LSTM has none of its own)."""
    layers: dict[str, tuple[th.Tensor, th.Tensor]] = {}
    for name, module in (("actor", policy.lstm_actor), ("critic", policy.lstm_critic)):
        if module is not None:
            if not getattr(module, "bias", False):
                raise ValueError(f"the {name} LSTM has no bias (lstm_kwargs bias=False), where the shift would go")
            layers[name] = (module.weight_ih_l0, module.bias_ih_l0)  # type: ignore[assignment]
    if isinstance(policy.critic, nn.Linear):
        layers["critic"] = (policy.critic.weight, policy.critic.bias)
    return layers


def ppo_hyperparameters(model: MultiAgentBaseAlgorithm, settings: UpdateSettings) -> dict[str, Any]:
    """The arguments of SB3's ``PPO`` that carry an agent's update settings (its group's) into an exported model, so
    that ``learn`` on the exported model goes on with them; PPO's defaults where IPPO has no equivalent."""
    return dict(
        learning_rate=settings.learning_rate,
        n_steps=max(model.rollout_len or model.n_steps or 2048, 2),  # rollout_len is SB3's n_steps per env copy
        batch_size=settings.batch_size or 64,
        n_epochs=settings.n_epochs,
        gamma=settings.gamma,
        gae_lambda=settings.gae_lambda,
        clip_range=settings.clip_range,
        clip_range_vf=settings.clip_range_vf,
        ent_coef=settings.ent_coef,
        vf_coef=settings.vf_coef,
        max_grad_norm=settings.max_grad_norm if settings.max_grad_norm is not None else float("inf"),
        target_kl=settings.target_kl,
        device=model.device,
    )


def exported_algorithm(
    model: MultiAgentBaseAlgorithm,
    agent_id: AgentID,
    algorithm: type[OnPolicyAlgorithm],
    policy_class: str | type[BasePolicy],
    observation_space: spaces.Space,
    policy_kwargs: Mapping[str, Any],
) -> OnPolicyAlgorithm:
    """A new SB3 ``algorithm`` (``PPO``, ``MaskablePPO``, ``RecurrentPPO``) for one agent, its policy not trained: the
    agent's group's update settings as its hyperparameters (:func:`ppo_hyperparameters`), and its policy, of
    ``policy_class`` with ``policy_kwargs``, built on ``observation_space`` (the space the agent's policy takes: images
    channel-first, so that the algorithm's ``predict`` transposes the env's images as the model does) and the agent's
    action space, with gSDE where the agent's policy has it."""
    settings = model._update_settings[model._group_of[agent_id]]  # the agent's group's own, where it sets them
    policy_kwargs = dict(policy_kwargs)
    policy_kwargs.pop("use_sde", None)  # an algorithm argument in SB3, read from the agent's policy
    use_sde = getattr(model.policies[agent_id], "use_sde", False)
    sde: dict[str, Any] = dict(use_sde=True, sde_sample_freq=model.sde_sample_freq) if use_sde else {}
    exported = algorithm(
        policy_class,  # type: ignore[arg-type]
        env=None,  # type: ignore[arg-type]
        **ppo_hyperparameters(model, settings),
        **sde,
        policy_kwargs=policy_kwargs,
        _init_setup_model=False,
    )
    exported.observation_space = observation_space
    exported.action_space = model.action_spaces[agent_id]
    exported.n_envs = 1
    exported.num_timesteps = model.num_timesteps
    exported._setup_model()
    return exported


def group_policy_kwargs(model: MultiAgentBaseAlgorithm, agent_id: AgentID) -> dict[str, Any]:
    """The ``policy_kwargs`` the agent's policy was built with: its group's own (``group_kwargs``), else the model's."""
    group = model._agent_groups[model._group_of[agent_id]]
    return dict(group.settings.get("policy_kwargs", model.policy_kwargs) or {})


def check_agent_id(model: MultiAgentBaseAlgorithm, agent_id: AgentID) -> None:
    """:raises KeyError: for an agent id the model does not know."""
    if agent_id not in model._policy_keys:
        raise KeyError(f"Unknown agent id {agent_id!r}: the model's agents are {model.possible_agents}")


def export_agent(model: MultiAgentBaseAlgorithm, agent_id: AgentID, path: str | pathlib.Path | io.BufferedIOBase) -> None:
    """``IPPO.export_agent``: one agent's policy as a plain SB3 ``PPO`` zip (a ``MaskablePPO`` zip for a masked agent, a
    ``RecurrentPPO`` zip for a recurrent one),
    with its group's update settings as the PPO's hyperparameters and the observation normalization folded in."""
    check_agent_id(model, agent_id)
    policy = model.policies[agent_id]
    masked = isinstance(policy, MaskedInputMixin)
    algorithm = MaskablePPO if masked else RecurrentPPO if is_recurrent(policy) else PPO
    policy_class = base_maskable_class(policy) if masked else type(policy)  # type: ignore[arg-type]
    ppo = exported_algorithm(
        model, agent_id, algorithm, policy_class, policy.observation_space, group_policy_kwargs(model, agent_id)
    )
    ppo.policy.load_state_dict(policy.state_dict())
    ppo.policy.optimizer.load_state_dict(policy.optimizer.state_dict())
    if model.obs_normalizers is not None:
        normalizer = model.obs_normalizers[agent_id]
        fold_observation_normalization(ppo.policy, unmasked_normalizer(normalizer) if masked else normalizer)  # type: ignore[arg-type]
    ppo.save(path)
