"""Agents of one group evaluated and trained as one batch: N independent networks at about the cost of one.

The members of a group have the same spaces and the same policy architecture, each with its own weights and its own
Adam optimizer. :class:`StackedPolicies` stacks their parameters along a new first axis and runs the networks of all
members at once -- SB3's MLP policies as batched matrix products (``baddbmm``), any other architecture with
``torch.func.vmap`` over ``functional_call``: acting is one forward call for every member and copy, and each
minibatch of an update is one forward, one backward, one gradient clip and one Adam step for the whole group (on
one ``(members, parameters)`` tensor, :class:`FlatParameters`).

The members' own ``ActorCriticPolicy`` objects stay the state of record (``model.policies``, save/load, export): an
update gathers their parameters and Adam states into stacked tensors, trains those, and writes the results back.
:func:`stacked_ppo_update` follows :func:`sb3_ippo.ppo_update.ppo_update` step for step for every member -- the
same minibatches, losses, gradient clipping, Adam arithmetic and KL early stop (a member that stopped takes no
further step: its parameters and optimizer state stay exactly as they were) -- so that both paths give the same
parameters (tests check it to 1e-5).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

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
from stable_baselines3.common.utils import explained_variance
from torch import nn
from torch.func import functional_call, vmap

from sb3_ippo.buffer import Trajectory
from sb3_ippo.normalization import ReturnNormalizer
from sb3_ippo.ppo_update import (
    KL_STOPS,
    AgentBatch,
    DrainedBatch,
    KLStop,
    TensorObs,
    UpdateStats,
    drain_to_tensors,
    finish_batch,
)
from sb3_ippo.vec_env import ObsArray

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
    if any(True for _ in first.buffers()):
        return "the policy has buffers (e.g. batch normalization)"
    if any(isinstance(module, nn.modules.dropout._DropoutNd) for module in first.modules()):
        return "the policy has dropout"
    if getattr(first, "use_sde", False) or not isinstance(first.action_dist, _STACKABLE_DISTRIBUTIONS):
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
        self._parameters = [p for policy in self.policies for p in policy.parameters()]
        self._cache_key: tuple[int, ...] | None = None
        self._cache: dict[str, th.Tensor] = {}

    @property
    def n_members(self) -> int:
        return len(self.policies)

    def _member_forward(self, params: dict[str, th.Tensor], obs: TensorObs) -> tuple[th.Tensor, th.Tensor]:
        return functional_call(self._heads, {"policy." + name: p for name, p in params.items()}, (obs,))

    def gather(self) -> dict[str, th.Tensor]:
        """The members' current parameters, stacked (a copy, detached)."""
        members = [dict(policy.named_parameters()) for policy in self.policies]
        return {name: th.stack([member[name].detach() for member in members]) for name in self.names}

    def current_parameters(self) -> dict[str, th.Tensor]:
        """:meth:`gather`, cached until a member's parameter changes in place (an optimizer step, ``load_state_dict``,
        a write under ``no_grad``: acting calls this every step)."""
        key = tuple(p._version for p in self._parameters)
        if key != self._cache_key:
            self._cache, self._cache_key = self.gather(), key
        return self._cache

    @th.no_grad()
    def scatter(self, params: dict[str, th.Tensor]) -> None:
        """Write stacked parameters back into the members' own parameters."""
        for index, policy in enumerate(self.policies):
            for name, parameter in policy.named_parameters():
                parameter.copy_(params[name][index])

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

    def forward(
        self, params: dict[str, th.Tensor], obs: TensorObs, deterministic: bool = False
    ) -> tuple[th.Tensor, th.Tensor, th.Tensor]:
        """Sampled (or deterministic) actions ``(n_members, batch, ...)``, values and log-probs ``(n_members, batch)``:
        what ``ActorCriticPolicy.forward`` gives each member."""
        distribution, values = self.distribution(params, obs)
        actions = distribution.get_actions(deterministic=deterministic)
        log_prob = distribution.log_prob(actions)
        return actions.unflatten(0, (self.n_members, -1)), values, log_prob.unflatten(0, (self.n_members, -1))

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


# ------------------------------------------------------------------------------------------------------------------
# Batches of several members, padded to one length
# ------------------------------------------------------------------------------------------------------------------


def _pad(tensors: Sequence[th.Tensor], length: int) -> th.Tensor:
    """Stack tensors of different lengths along a new first axis, zero-padded to ``length`` rows."""
    padded = tensors[0].new_zeros((len(tensors), length, *tensors[0].shape[1:]))
    for index, tensor in enumerate(tensors):
        padded[index, : len(tensor)] = tensor
    return padded


def _pad_obs(observations: Sequence[TensorObs], length: int) -> TensorObs:
    if isinstance(observations[0], dict):
        return {key: _pad([obs[key] for obs in observations], length) for key in observations[0]}  # type: ignore[index]
    return _pad(observations, length)  # type: ignore[arg-type]


def _take(obs: TensorObs, rows: slice | th.Tensor, index: slice | th.Tensor) -> TensorObs:
    """``obs[rows, index]`` of each member's ``(n_members, length, ...)`` observations."""
    if isinstance(obs, dict):
        return {key: value[rows, index] for key, value in obs.items()}
    return obs[rows, index]


@dataclass
class StackedBatch:
    """The members' training batches, each padded to the longest; ``mask`` marks the real rows."""

    observations: TensorObs
    actions: th.Tensor
    old_log_prob: th.Tensor
    old_values: th.Tensor
    advantages: th.Tensor
    returns: th.Tensor
    mask: th.Tensor
    lengths: list[int]
    n_trajectories: list[int]

    @classmethod
    def from_batches(cls, batches: Sequence[AgentBatch]) -> StackedBatch:
        length = max(len(batch) for batch in batches)
        return cls(
            observations=_pad_obs([batch.observations for batch in batches], length),
            actions=_pad([batch.actions for batch in batches], length),
            old_log_prob=_pad([batch.old_log_prob for batch in batches], length),
            old_values=_pad([batch.old_values for batch in batches], length),
            advantages=_pad([batch.advantages for batch in batches], length),
            returns=_pad([batch.returns for batch in batches], length),
            mask=_pad([th.ones(len(batch), dtype=th.bool, device=batch.advantages.device) for batch in batches], length),
            lengths=[len(batch) for batch in batches],
            n_trajectories=[batch.n_trajectories for batch in batches],
        )

    def take(self, index: slice | th.Tensor) -> StackedBatch:
        """Rows ``index`` of every member: a slice of positions, or ``(n_members, k)`` positions per member."""
        rows: slice | th.Tensor = slice(None)
        if isinstance(index, th.Tensor):
            rows = th.arange(len(self.mask), device=self.mask.device)[:, None]
        return StackedBatch(
            observations=_take(self.observations, rows, index),
            actions=self.actions[rows, index],
            old_log_prob=self.old_log_prob[rows, index],
            old_values=self.old_values[rows, index],
            advantages=self.advantages[rows, index],
            returns=self.returns[rows, index],
            mask=self.mask[rows, index],
            lengths=self.lengths,
            n_trajectories=self.n_trajectories,
        )


def stacked_build_batch(
    stacked: StackedPolicies,
    trajectories: Sequence[Sequence[Trajectory]],
    gamma: float,
    gae_lambda: float,
    recompute_values: bool = True,
    recompute_log_prob: bool = True,
    preprocess_obs: Sequence[Callable[[ObsArray], ObsArray] | None] | None = None,
    return_normalizers: Sequence[ReturnNormalizer] | None = None,
    time_limit_bootstrap: bool = True,
) -> StackedBatch:
    """:func:`sb3_ippo.ppo_update.build_batch` for every member (``trajectories[i]`` are member ``i``'s), with the
    recomputation of values, log-probs and bootstrap values in one forward pass for the whole group."""
    policies = stacked.policies
    drained: list[DrainedBatch] = [
        drain_to_tensors(
            member,
            policy.action_space,
            policy.device,
            None if preprocess_obs is None else preprocess_obs[i],
            time_limit_bootstrap,
        )
        for i, (member, policy) in enumerate(zip(trajectories, policies, strict=True))
    ]
    # Each member's bootstrap observations ride behind its batch, so one forward pass covers both.
    inputs = [
        d.observations if d.bootstrap_obs is None else concat_tensor_obs([d.observations, d.bootstrap_obs]) for d in drained
    ]
    actions = [
        d.actions if d.bootstrap_obs is None else th.cat([d.actions, d.actions[: len(d.bootstrapped)]]) for d in drained
    ]
    length = max(len(d) + len(d.bootstrapped) for d in drained)
    with th.no_grad():
        values, log_prob, _ = stacked.evaluate_actions(stacked.gather(), _pad_obs(inputs, length), _pad(actions, length))
    batches = []
    for i, member in enumerate(drained):
        n = len(member)
        batches.append(
            finish_batch(
                member,
                values[i, :n] if recompute_values else None,
                log_prob[i, :n] if recompute_log_prob else None,
                values[i, n : n + len(member.bootstrapped)] if member.bootstrapped else None,
                gamma,
                gae_lambda,
                None if return_normalizers is None else return_normalizers[i],
            )
        )
    return StackedBatch.from_batches(batches)


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


# ------------------------------------------------------------------------------------------------------------------
# The update
# ------------------------------------------------------------------------------------------------------------------


class FlatParameters:
    """The members' parameters as one ``(n_members, n_parameters)`` leaf tensor, so that the whole group's gradient
    clipping and Adam step are a handful of tensor operations. :meth:`as_dict` splits it (differentiably) into the
    named, stacked parameters the networks take; its backward pass concatenates their gradients into ``flat.grad``."""

    def __init__(self, params: dict[str, th.Tensor]) -> None:
        self.names = list(params)
        self.shapes = [params[name].shape[1:] for name in self.names]
        self.sizes = [shape.numel() for shape in self.shapes]
        n_members = next(iter(params.values())).shape[0]
        self.flat = th.cat([params[name].reshape(n_members, -1) for name in self.names], dim=1).requires_grad_(True)

    def as_dict(self, flat: th.Tensor | None = None) -> dict[str, th.Tensor]:
        flat = self.flat if flat is None else flat
        pieces = flat.split(self.sizes, dim=1)
        return {
            name: piece.view(len(flat), *shape) for name, piece, shape in zip(self.names, pieces, self.shapes, strict=True)
        }


class StackedAdam:
    """torch's Adam (its single-tensor arithmetic) on a group's :class:`FlatParameters`, with each member's own step
    count and moments, gathered from and written back to the members' own optimizers. A member left out of a step
    (``active`` False) keeps its parameters, moments and step count exactly."""

    def __init__(self, flat: FlatParameters, policies: Sequence[ActorCriticPolicy]) -> None:
        self.flat = flat
        self.policies = policies
        group = policies[0].optimizer.param_groups[0]
        self.beta1, self.beta2 = group["betas"]
        self.eps = group["eps"]
        self.lr = group["lr"]
        exp_avg, exp_avg_sq, steps = [], [], []
        for policy in policies:
            parameters = dict(policy.named_parameters())
            states = [policy.optimizer.state.get(parameters[name], {}) for name in flat.names]
            member_steps = {float(state["step"]) if state else 0.0 for state in states}
            if len(member_steps) != 1:
                raise ValueError("A member's parameters have taken different numbers of Adam steps: it cannot be stacked")
            steps.append(member_steps.pop())
            sizes = zip(states, flat.sizes, strict=True)
            exp_avg.append(th.cat([state["exp_avg"].flatten() if state else th.zeros(size) for state, size in sizes]))
            sizes = zip(states, flat.sizes, strict=True)
            exp_avg_sq.append(th.cat([state["exp_avg_sq"].flatten() if state else th.zeros(size) for state, size in sizes]))
        device = flat.flat.device
        self.exp_avg = th.stack(exp_avg).to(device)
        self.exp_avg_sq = th.stack(exp_avg_sq).to(device)
        self.steps = steps

    @th.no_grad()
    def step(self, active: list[bool]) -> None:
        """One Adam step of the ``active`` members (a list of ``n_members`` bools)."""
        param, grad = self.flat.flat, self.flat.flat.grad
        assert grad is not None
        self.steps = [step + 1 if on else step for step, on in zip(self.steps, active, strict=True)]
        # Bias corrections in Python floats, as torch's Adam computes them; 0 leaves an inactive member alone.
        step_size = [self.lr / (1 - self.beta1**step) if on else 0.0 for step, on in zip(self.steps, active, strict=True)]
        correction2_sqrt = [math.sqrt(1 - self.beta2**step) if step > 0 else 1.0 for step in self.steps]
        on = th.tensor(active, dtype=param.dtype, device=param.device)[:, None]
        if all(active):
            self.exp_avg.lerp_(grad, 1 - self.beta1)
            self.exp_avg_sq.mul_(self.beta2).addcmul_(grad, grad, value=1 - self.beta2)
        else:
            self.exp_avg.lerp_(grad, (1 - self.beta1) * on)
            decay = th.where(on.bool(), self.beta2, 1.0)
            self.exp_avg_sq.mul_(decay).add_(grad * grad * ((1 - self.beta2) * on))
        denom = (self.exp_avg_sq.sqrt() / th.tensor(correction2_sqrt, dtype=param.dtype, device=param.device)[:, None]).add_(
            self.eps
        )
        param.sub_(th.tensor(step_size, dtype=param.dtype, device=param.device)[:, None] * (self.exp_avg / denom))

    def scatter(self) -> None:
        """Write each member's moments and step count back into its own optimizer (members that never stepped keep
        an empty state, as torch's Adam does)."""
        exp_avg, exp_avg_sq = self.flat.as_dict(self.exp_avg), self.flat.as_dict(self.exp_avg_sq)
        for index, policy in enumerate(self.policies):
            if self.steps[index] == 0:
                continue
            for name, parameter in policy.named_parameters():
                policy.optimizer.state[parameter] = {
                    "step": th.tensor(self.steps[index], dtype=th.float32),
                    "exp_avg": exp_avg[name][index].clone(),
                    "exp_avg_sq": exp_avg_sq[name][index].clone(),
                }


def _masked_mean(values: th.Tensor, mask: th.Tensor) -> th.Tensor:
    """Per member: the mean over its real rows."""
    return (values * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1)


@dataclass
class _StackedLosses:
    policy_loss: th.Tensor
    value_loss: th.Tensor
    entropy_loss: th.Tensor
    approx_kl: th.Tensor
    clip_fraction: th.Tensor


def _stacked_losses(
    stacked: StackedPolicies,
    params: dict[str, th.Tensor],
    batch: StackedBatch,
    advantages: th.Tensor,
    mask: th.Tensor,
    clip_range: float,
    clip_range_vf: float | None,
) -> _StackedLosses:
    """Each member's SB3 PPO losses on its rows in ``mask`` (``(n_members,)`` tensors), as ``ppo_update._losses``."""
    values, log_prob, entropy = stacked.evaluate_actions(params, batch.observations, batch.actions)
    mask_f = mask.float()
    log_ratio = (log_prob - batch.old_log_prob) * mask_f  # padded rows: ratio 1, so nothing overflows
    ratio = th.exp(log_ratio)
    surrogate = th.min(advantages * ratio, advantages * th.clamp(ratio, 1 - clip_range, 1 + clip_range))
    if clip_range_vf is None:
        values_pred = values
    else:
        values_pred = batch.old_values + th.clamp(values - batch.old_values, -clip_range_vf, clip_range_vf)
    policy_loss = -_masked_mean(surrogate, mask_f)
    value_loss = _masked_mean((batch.returns - values_pred) ** 2, mask_f)
    entropy_loss = -_masked_mean(-log_prob if entropy is None else entropy, mask_f)
    with th.no_grad():
        approx_kl = _masked_mean((ratio - 1) - log_ratio, mask_f)
        clip_fraction = _masked_mean((th.abs(ratio - 1) > clip_range).float(), mask_f)
    return _StackedLosses(policy_loss, value_loss, entropy_loss, approx_kl, clip_fraction)


def _normalized_advantages(batch: StackedBatch, normalize_advantage: bool) -> th.Tensor:
    if not normalize_advantage:
        return batch.advantages
    advantages = batch.advantages.clone()
    for index, length in enumerate(batch.lengths):
        if length > 1:
            member = advantages[index, :length]
            advantages[index, :length] = (member - member.mean()) / (member.std() + 1e-8)
    return advantages


def _clip_grad_norms(flat: th.Tensor, max_grad_norm: float) -> None:
    """``clip_grad_norm_`` of every member's gradients on its own (a row of the flat gradient)."""
    grad = flat.grad
    assert grad is not None
    total_norm = th.linalg.vector_norm(grad, dim=1, keepdim=True)
    grad.mul_(th.clamp(max_grad_norm / (total_norm + 1e-6), max=1.0))


def _minibatch_index(batch: StackedBatch, generators: Sequence[th.Generator | None] | None, device: th.device) -> th.Tensor:
    """``(n_members, length)``: each member's rows shuffled for this pass, its padding last."""
    length = batch.mask.shape[1]
    orders = []
    for index, n in enumerate(batch.lengths):
        order = th.randperm(n, generator=None if generators is None else generators[index])
        orders.append(th.cat([order, th.arange(n, length)]))
    return th.stack(orders).to(device)


def stacked_ppo_update(
    stacked: StackedPolicies,
    batch: StackedBatch,
    n_epochs: int,
    batch_size: int | None = None,
    clip_range: float = 0.2,
    clip_range_vf: float | None = None,
    normalize_advantage: bool = True,
    ent_coef: float = 0.0,
    vf_coef: float = 0.5,
    max_grad_norm: float | None = 0.5,
    target_kl: float | None = 0.01,
    kl_stop: KLStop = "after_step",
    shuffle_minibatches: bool = False,
    generators: Sequence[th.Generator | None] | None = None,
) -> list[UpdateStats]:
    """:func:`sb3_ippo.ppo_update.ppo_update` of every member at once: the same minibatches of each member's own
    batch, the same losses, per-member gradient clipping and Adam, and each member's own KL early stop.

    With ``shuffle_minibatches``, member ``i``'s permutations are drawn from ``generators[i]``.
    """
    if kl_stop not in KL_STOPS:
        raise ValueError(f"kl_stop must be one of {KL_STOPS}, got {kl_stop!r}")
    n_members = stacked.n_members
    device = batch.mask.device
    flat = FlatParameters(stacked.gather())
    optimizer = StackedAdam(flat, stacked.policies)
    advantages = _normalized_advantages(batch, normalize_advantage)
    length = batch.mask.shape[1]
    minibatch_size = length if batch_size is None else batch_size

    with th.no_grad():
        before = _stacked_losses(stacked, flat.as_dict(), batch, advantages, batch.mask, clip_range, clip_range_vf)

    active = [True] * n_members
    n_epochs_run = [0] * n_members
    for _ in range(n_epochs):
        if not any(active):
            break
        order = _minibatch_index(batch, generators, device) if shuffle_minibatches else None
        stepped = [False] * n_members
        for start in range(0, length, minibatch_size):
            # Padding comes last in every order: a member has rows in this minibatch while start < its length.
            has_rows = [on and start < n for on, n in zip(active, batch.lengths, strict=True)]
            if not any(has_rows):
                break
            if order is None:
                index: slice | th.Tensor = slice(start, start + minibatch_size)
                minibatch, minibatch_advantages = batch.take(index), advantages[:, index]
            else:
                index = order[:, start : start + minibatch_size]
                minibatch, minibatch_advantages = batch.take(index), advantages.gather(1, index)
            mask = minibatch.mask & th.tensor(has_rows, device=device)[:, None]
            losses = _stacked_losses(
                stacked, flat.as_dict(), minibatch, minibatch_advantages, mask, clip_range, clip_range_vf
            )
            kls = losses.approx_kl.tolist()
            too_far = [rows and target_kl is not None and kl > 1.5 * target_kl for rows, kl in zip(has_rows, kls, strict=True)]
            steps = [rows and not (far and kl_stop == "before_step") for rows, far in zip(has_rows, too_far, strict=True)]
            if any(steps):
                loss = losses.policy_loss + ent_coef * losses.entropy_loss + vf_coef * losses.value_loss
                flat.flat.grad = None
                (loss * th.tensor(steps, dtype=loss.dtype, device=device)).sum().backward()
                if max_grad_norm is not None:
                    _clip_grad_norms(flat.flat, max_grad_norm)
                optimizer.step(steps)
                stepped = [done or now for done, now in zip(stepped, steps, strict=True)]
            active = [on and not far for on, far in zip(active, too_far, strict=True)]
        n_epochs_run = [count + done for count, done in zip(n_epochs_run, stepped, strict=True)]

    with th.no_grad():
        flat.flat.grad = None
        params = flat.as_dict()
        after = _stacked_losses(stacked, params, batch, advantages, batch.mask, clip_range, clip_range_vf)
        stacked.scatter(params)
        optimizer.scatter()

    stats = []
    for i in range(n_members):
        n = batch.lengths[i]
        stats.append(
            UpdateStats(
                policy_loss=after.policy_loss[i].item(),
                policy_loss_delta=(after.policy_loss[i] - before.policy_loss[i]).item(),
                value_loss=after.value_loss[i].item(),
                value_loss_delta=(after.value_loss[i] - before.value_loss[i]).item(),
                approx_kl=after.approx_kl[i].item(),
                entropy_loss=after.entropy_loss[i].item(),
                clip_fraction=after.clip_fraction[i].item(),
                explained_variance=float(
                    explained_variance(batch.old_values[i, :n].cpu().numpy(), batch.returns[i, :n].cpu().numpy())
                ),
                n_epochs_run=int(n_epochs_run[i]),
                n_transitions=n,
                n_trajectories=batch.n_trajectories[i],
            )
        )
    return stats
