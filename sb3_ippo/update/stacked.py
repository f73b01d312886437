"""Agents of one group evaluated as one batch: N independent networks at about the cost of one.

The members of a group have the same spaces and the same policy architecture, each with its own weights and its own
Adam optimizer. :class:`StackedPolicies` stacks their parameters along a new first axis and runs the networks of all
members at once -- SB3's MLP policies as batched matrix products (``baddbmm``), any other architecture with
``torch.func.vmap`` over ``functional_call``: acting is one forward call for every member and copy, and so is each
minibatch of an update (:mod:`sb3_ippo.update.stacked_update`).

The members' own ``ActorCriticPolicy`` objects stay the state of record (``model.policies``, save/load, export): the
stacked parameters are gathered from them at every call (a few tens of microseconds), so that any write to a member's
weights -- an optimizer step, ``load_state_dict``, a callback writing through ``.data`` -- acts at once.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

import torch as th
from stable_baselines3.common.distributions import (
    BernoulliDistribution,
    CategoricalDistribution,
    DiagGaussianDistribution,
    Distribution,
    MultiCategoricalDistribution,
)
from stable_baselines3.common.policies import ActorCriticPolicy
from stable_baselines3.common.preprocessing import preprocess_obs
from stable_baselines3.common.torch_layers import FlattenExtractor, MlpExtractor
from torch import nn
from torch.func import functional_call, vmap

from sb3_ippo.update.batch import TensorObs

_STACKABLE_DISTRIBUTIONS = (
    CategoricalDistribution,
    MultiCategoricalDistribution,
    BernoulliDistribution,
    DiagGaussianDistribution,
)


def why_not_stackable(policies: Sequence[ActorCriticPolicy]) -> str | None:
    """Why these policies cannot be stacked, or None if they can."""
    first = policies[0]
    if any(type(policy) is not type(first) for policy in policies):
        return "the members' policy classes differ"
    shapes = [[(name, p.shape) for name, p in policy.named_parameters()] for policy in policies]
    if any(shape != shapes[0] for shape in shapes):
        return "the members' networks differ in shape"
    trainable = [[p.requires_grad for p in policy.parameters()] for policy in policies]
    if any(pattern != trainable[0] for pattern in trainable):
        return "the members freeze different parameters (requires_grad)"
    if any(True for _ in first.buffers()):
        return "the policy has buffers (e.g. batch normalization)"
    if any(isinstance(module, nn.modules.dropout._DropoutNd) for module in first.modules()):
        return "the policy has dropout"
    if getattr(first, "use_sde", False):
        return "gSDE (use_sde) explores with each member's own noise matrices, which acting one member at a time uses"
    if not isinstance(first.action_dist, _STACKABLE_DISTRIBUTIONS):
        return f"its action distribution {type(first.action_dist).__name__} is not supported"
    for policy in policies:
        optimizer = policy.optimizer
        if type(optimizer) is not th.optim.Adam or len(optimizer.param_groups) != 1:
            return "the optimizer is not a single-group torch.optim.Adam"
        group = optimizer.param_groups[0]
        if group["weight_decay"] or group["amsgrad"] or group["maximize"] or group.get("decoupled_weight_decay"):
            return "Adam's weight decay, amsgrad and maximize are not supported"
    return None


class _Heads(nn.Module):
    """One member's networks, from preprocessed observations to the distribution's inputs and the value."""

    def __init__(self, policy: ActorCriticPolicy) -> None:
        super().__init__()
        self.policy = policy

    def forward(self, obs: TensorObs) -> tuple[th.Tensor, th.Tensor]:
        policy = self.policy
        if policy.share_features_extractor:
            latent_pi, latent_vf = policy.mlp_extractor(policy.features_extractor(obs))
        else:
            latent_pi = policy.mlp_extractor.forward_actor(policy.pi_features_extractor(obs))
            latent_vf = policy.mlp_extractor.forward_critic(policy.vf_features_extractor(obs))
        return policy.action_net(latent_pi), policy.value_net(latent_vf).squeeze(-1)


def _mlp_layers(policy: ActorCriticPolicy) -> dict[str, list[tuple[str, nn.Module]]] | None:
    """For a policy of flattened observations through SB3's ``MlpExtractor`` into linear heads: each path's layers as
    ``(parameter prefix or "", module)``, so that :class:`StackedPolicies` runs them as batched matrix products
    without ``vmap``'s overhead. None for any other architecture."""
    extractors = {policy.features_extractor, policy.pi_features_extractor, policy.vf_features_extractor}
    if not all(isinstance(extractor, FlattenExtractor) for extractor in extractors):
        return None
    if not isinstance(policy.mlp_extractor, MlpExtractor) or not isinstance(policy.action_net, nn.Linear):
        return None
    if not isinstance(policy.value_net, nn.Linear):
        return None
    paths: dict[str, list[tuple[str, nn.Module]]] = {}
    for path, network, head in (("pi", "policy_net", "action_net"), ("vf", "value_net", "value_net")):
        prefix = f"mlp_extractor.{network}"
        layers: list[tuple[str, nn.Module]] = []
        for index, module in enumerate(getattr(policy.mlp_extractor, network)):
            if isinstance(module, nn.Linear):
                layers.append((f"{prefix}.{index}", module))
            elif any(True for _ in module.parameters()):
                return None
            else:
                layers.append(("", module))
        layers.append((head, getattr(policy, head)))
        paths[path] = layers
    return paths


def _run_layers(layers: list[tuple[str, nn.Module]], params: dict[str, th.Tensor], x: th.Tensor) -> th.Tensor:
    for prefix, module in layers:
        if prefix:
            bias = params.get(prefix + ".bias")
            weight = params[prefix + ".weight"].transpose(1, 2)
            x = th.bmm(x, weight) if bias is None else th.baddbmm(bias.unsqueeze(1), x, weight)
        else:
            x = module(x)
    return x


def _flatten_leading(obs: TensorObs) -> TensorObs:
    if isinstance(obs, dict):
        return {key: value.flatten(0, 1) for key, value in obs.items()}
    return obs.flatten(0, 1)


def _unflatten_leading(obs: TensorObs, n_members: int) -> TensorObs:
    if isinstance(obs, dict):
        return {key: value.unflatten(0, (n_members, -1)) for key, value in obs.items()}
    return obs.unflatten(0, (n_members, -1))


class StackedPolicies:
    """The networks of ``policies`` (same class and shapes) evaluated as one batch on stacked parameters.

    Every method takes ``params``, a dict of stacked parameters (``(n_members, *shape)``, from :meth:`gather` or
    being trained), and observations shaped ``(n_members, batch, *obs_shape)`` as the policies take them.
    """

    def __init__(self, policies: Sequence[ActorCriticPolicy]) -> None:
        reason = why_not_stackable(policies)
        if reason is not None:
            raise ValueError(f"These policies cannot be stacked: {reason}")
        self.policies = list(policies)
        template = policies[0]
        self.observation_space = template.observation_space
        self.normalize_images = template.normalize_images
        self.names = [name for name, _ in template.named_parameters()]
        self._action_dist: Distribution = copy.copy(template.action_dist)
        self._mlp = _mlp_layers(template)
        if self._mlp is None:
            # A structural copy to call with the stacked parameters: the members' own modules are never touched.
            self._heads = _Heads(copy.deepcopy(template)).to("meta")
            self._forward = vmap(self._member_forward)
        members = [dict(policy.named_parameters()) for policy in self.policies]
        self._by_name: dict[str, list[th.Tensor]] = {name: [member[name] for member in members] for name in self.names}

    @property
    def trainable(self) -> list[str]:
        """The names of the parameters the update trains (``requires_grad``), read now: a layer may be frozen after
        the model was built.

        :raises ValueError: if the members no longer freeze the same parameters.
        """
        patterns = {tuple(name for name, p in policy.named_parameters() if p.requires_grad) for policy in self.policies}
        if len(patterns) > 1:
            raise ValueError(
                "The members of a stacked group freeze different parameters (requires_grad): freeze the same ones in "
                "every member, or train with batched=False"
            )
        return list(patterns.pop())

    @property
    def n_members(self) -> int:
        return len(self.policies)

    def _member_forward(self, params: dict[str, th.Tensor], obs: TensorObs) -> tuple[th.Tensor, th.Tensor]:
        return functional_call(self._heads, {"policy." + name: p for name, p in params.items()}, (obs,))

    @th.no_grad()
    def gather(self) -> dict[str, th.Tensor]:
        """The members' current parameters, stacked (a copy, detached)."""
        return {name: th.stack(parameters) for name, parameters in self._by_name.items()}

    @th.no_grad()
    def scatter(self, params: dict[str, th.Tensor]) -> None:
        """Write the stacked parameters ``params`` (some or all names) back into the members' own parameters."""
        for name, stacked in params.items():
            for parameter, member in zip(self._by_name[name], stacked, strict=True):
                parameter.copy_(member)

    def distribution(self, params: dict[str, th.Tensor], obs: TensorObs) -> tuple[Distribution, th.Tensor]:
        """The members' action distributions over the flattened ``(n_members * batch)`` rows, and the values
        ``(n_members, batch)``."""
        dist_inputs, values = self._heads_outputs(params, obs)
        flat_inputs = dist_inputs.flatten(0, 1)
        distribution: Distribution
        if isinstance(self._action_dist, DiagGaussianDistribution):
            log_std = params["log_std"][:, None, :].expand(dist_inputs.shape)
            distribution = self._action_dist.proba_distribution(flat_inputs, log_std.flatten(0, 1))
        else:
            distribution = self._action_dist.proba_distribution(flat_inputs)  # type: ignore[call-arg]
        return distribution, values

    def _heads_outputs(self, params: dict[str, th.Tensor], obs: TensorObs) -> tuple[th.Tensor, th.Tensor]:
        """The action heads' outputs ``(n_members, batch, ...)`` (the distributions' inputs) and the values
        ``(n_members, batch)``."""
        n_members = self.n_members
        preprocessed = preprocess_obs(_flatten_leading(obs), self.observation_space, self.normalize_images)
        if self._mlp is not None:
            assert isinstance(preprocessed, th.Tensor)  # a FlattenExtractor's input: not a Dict observation
            features = preprocessed.reshape(n_members, -1, preprocessed[0].numel())
            dist_inputs = _run_layers(self._mlp["pi"], params, features)
            values = _run_layers(self._mlp["vf"], params, features).squeeze(-1)
        else:
            dist_inputs, values = self._forward(params, _unflatten_leading(preprocessed, n_members))  # type: ignore[arg-type]
        return dist_inputs, values

    def act(
        self, params: dict[str, th.Tensor], obs: TensorObs, members: Sequence[int], deterministic: bool = False
    ) -> list[tuple[th.Tensor, th.Tensor, th.Tensor]]:
        """What ``ActorCriticPolicy.forward`` gives each of ``members`` (indices): sampled (or deterministic) actions,
        values and log-probs, each ``(batch, ...)``. Every member's rows go through the networks (the stacked shapes
        stay fixed), but actions are drawn for ``members`` only, each from its own distribution in turn, as their own
        policies would draw them: so the random draws, and the results, are those of the one-agent-at-a-time path."""
        dist_inputs, values = self._heads_outputs(params, obs)
        if type(self._action_dist) is CategoricalDistribution:
            # One categorical draw over several members' rows takes the same random numbers as their draws in turn.
            rows = dist_inputs[list(members)].flatten(0, 1)
            categorical = self._action_dist.proba_distribution(rows)
            actions = categorical.get_actions(deterministic=deterministic)
            log_prob = categorical.log_prob(actions)
            sizes = [dist_inputs.shape[1]] * len(members)
            return list(zip(actions.split(sizes), [values[i] for i in members], log_prob.split(sizes), strict=True))
        outputs = []
        for i in members:
            distribution = self._member_distribution(params, dist_inputs[i], i)
            actions = distribution.get_actions(deterministic=deterministic)
            outputs.append((actions, values[i], distribution.log_prob(actions)))
        return outputs

    def _member_distribution(self, params: dict[str, th.Tensor], dist_inputs: th.Tensor, index: int) -> Distribution:
        if isinstance(self._action_dist, DiagGaussianDistribution):
            return self._action_dist.proba_distribution(dist_inputs, params["log_std"][index])
        return self._action_dist.proba_distribution(dist_inputs)  # type: ignore[call-arg]

    def evaluate_actions(
        self, params: dict[str, th.Tensor], obs: TensorObs, actions: th.Tensor
    ) -> tuple[th.Tensor, th.Tensor, th.Tensor | None]:
        """Values, log-probs and entropies ``(n_members, batch)``: ``ActorCriticPolicy.evaluate_actions`` of every
        member on its own rows. ``actions`` is ``(n_members, batch, ...)``, each member's in SB3's layout."""
        if type(self._action_dist) is CategoricalDistribution:
            # What torch's Categorical computes, without building one: a sixth of a minibatch step's time.
            logits, values = self._heads_outputs(params, obs)
            log_p = th.log_softmax(logits, dim=-1)
            log_prob = log_p.gather(-1, actions.long().reshape(self.n_members, -1, 1)).squeeze(-1)
            return values, log_prob, -(log_p.exp() * log_p).sum(-1)
        distribution, values = self.distribution(params, obs)
        log_prob = distribution.log_prob(actions.flatten(0, 1)).unflatten(0, (self.n_members, -1))
        entropy = distribution.entropy()
        return values, log_prob, None if entropy is None else entropy.unflatten(0, (self.n_members, -1))




def concat_tensor_obs(observations: Sequence[TensorObs]) -> TensorObs:
    """Concatenate batches of observations (tensors, or dicts of tensors) along the first axis."""
    if isinstance(observations[0], dict):
        return {key: th.cat([obs[key] for obs in observations]) for key in observations[0]}  # type: ignore[index]
    return th.cat(observations)  # type: ignore[arg-type]


def stack_tensor_obs(observations: Sequence[TensorObs]) -> TensorObs:
    """Stack equally long batches of observations (tensors, or dicts of tensors) along a new first axis."""
    if isinstance(observations[0], dict):
        return {key: th.stack([obs[key] for obs in observations]) for key in observations[0]}  # type: ignore[index]
    return th.stack(observations)  # type: ignore[arg-type]


