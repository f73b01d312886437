"""Agents of one group evaluated and trained as one batch: N independent networks at about the cost of one.

The members of a group have the same spaces and the same policy architecture, each with its own weights and its own
Adam optimizer. :class:`StackedPolicies` stacks their parameters along a new first axis and runs the networks of all
members with ``torch.func.vmap`` over ``functional_call``: acting is one forward call for every member and copy, and
each minibatch of an update is one forward, one backward, one gradient clip and one Adam step for the whole group.

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
        # A structural copy to call with the stacked parameters: the members' own modules are never touched.
        self._heads = _Heads(copy.deepcopy(template)).to("meta")
        self._action_dist: Distribution = copy.copy(template.action_dist)
        self._forward = vmap(self._member_forward)
        self._cache_key: tuple[tuple[int, int], ...] | None = None
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
        """:meth:`gather`, cached until a member's parameter changes (acting calls this every step)."""
        key = tuple((id(p), p._version) for policy in self.policies for p in policy.parameters())
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
        n_members = self.n_members
        preprocessed = preprocess_obs(_flatten_leading(obs), self.observation_space, self.normalize_images)
        dist_inputs, values = self._forward(params, _unflatten_leading(preprocessed, n_members))  # type: ignore[arg-type]
        flat_inputs = dist_inputs.flatten(0, 1)
        distribution: Distribution
        if isinstance(self._action_dist, DiagGaussianDistribution):
            log_std = params["log_std"][:, None, :].expand(dist_inputs.shape)
            distribution = self._action_dist.proba_distribution(flat_inputs, log_std.flatten(0, 1))
        else:
            distribution = self._action_dist.proba_distribution(flat_inputs)  # type: ignore[call-arg]
        return distribution, values

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


def _take(obs: TensorObs, index: th.Tensor) -> TensorObs:
    """Rows ``index`` (``(n_members, k)``) of each member's ``(n_members, length, ...)`` observations."""

    def take(tensor: th.Tensor) -> th.Tensor:
        rows = th.arange(len(tensor), device=tensor.device)[:, None]
        return tensor[rows, index]

    if isinstance(obs, dict):
        return {key: take(value) for key, value in obs.items()}
    return take(obs)


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

    def take(self, index: th.Tensor) -> StackedBatch:
        """Rows ``index`` (``(n_members, k)``) of every member."""
        rows = th.arange(len(self.mask), device=self.mask.device)[:, None]
        return StackedBatch(
            observations=_take(self.observations, index),
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
) -> StackedBatch:
    """:func:`sb3_ippo.ppo_update.build_batch` for every member (``trajectories[i]`` are member ``i``'s), with the
    recomputation of values, log-probs and bootstrap values in one forward pass for the whole group."""
    policies = stacked.policies
    drained: list[DrainedBatch] = [
        drain_to_tensors(member, policy.action_space, policy.device, None if preprocess_obs is None else preprocess_obs[i])
        for i, (member, policy) in enumerate(zip(trajectories, policies, strict=True))
    ]
    # Each member's bootstrap observations ride behind its batch, so one forward pass covers both.
    inputs = [
        d.observations if d.bootstrap_obs is None else concat_tensor_obs([d.observations, d.bootstrap_obs]) for d in drained
    ]
    actions = [
        d.actions if d.bootstrap_obs is None else th.cat([d.actions, d.actions[: len(d.truncated)]]) for d in drained
    ]
    length = max(len(d) + len(d.truncated) for d in drained)
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
                values[i, n : n + len(member.truncated)] if member.truncated else None,
                gamma,
                gae_lambda,
                None if return_normalizers is None else return_normalizers[i],
                policies[i].value_net,
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


class StackedAdam:
    """torch's Adam (its single-tensor arithmetic) on stacked parameters, with each member's own step count and
    moments, gathered from and written back to the members' own optimizers. A member left out of a step (``active``
    False) keeps its parameters, moments and step count exactly."""

    def __init__(self, params: dict[str, th.Tensor], policies: Sequence[ActorCriticPolicy]) -> None:
        self.params = params
        self.policies = policies
        group = policies[0].optimizer.param_groups[0]
        self.beta1, self.beta2 = group["betas"]
        self.eps = group["eps"]
        self.lr = group["lr"]
        self.exp_avg: dict[str, th.Tensor] = {}
        self.exp_avg_sq: dict[str, th.Tensor] = {}
        self.step_count: dict[str, th.Tensor] = {}
        members = [dict(policy.named_parameters()) for policy in policies]
        for name, stacked in params.items():
            states = [policy.optimizer.state.get(member[name], {}) for policy, member in zip(policies, members, strict=True)]
            self.exp_avg[name] = th.stack([s.get("exp_avg", th.zeros_like(stacked[0])) for s in states])
            self.exp_avg_sq[name] = th.stack([s.get("exp_avg_sq", th.zeros_like(stacked[0])) for s in states])
            self.step_count[name] = th.stack([s.get("step", th.tensor(0.0)).float().reshape(()) for s in states])

    @th.no_grad()
    def step(self, active: th.Tensor) -> None:
        everyone = bool(active.all())
        for name, param in self.params.items():
            grad = param.grad
            assert grad is not None
            step = self.step_count[name] + active.float()
            # Python floats, as torch's Adam computes its bias corrections.
            steps = step.tolist()
            step_size = th.tensor([self.lr / (1 - self.beta1**s) if s > 0 else 0.0 for s in steps], dtype=param.dtype)
            correction2_sqrt = th.tensor([math.sqrt(1 - self.beta2**s) if s > 0 else 1.0 for s in steps], dtype=param.dtype)
            shape = (-1,) + (1,) * (param.dim() - 1)
            exp_avg = self.exp_avg[name].lerp(grad, 1 - self.beta1)
            exp_avg_sq = self.exp_avg_sq[name].mul(self.beta2).addcmul_(grad, grad, value=1 - self.beta2)
            denom = (exp_avg_sq.sqrt() / correction2_sqrt.view(shape)).add_(self.eps)
            new_param = param - step_size.view(shape) * (exp_avg / denom)
            if everyone:
                self.exp_avg[name], self.exp_avg_sq[name] = exp_avg, exp_avg_sq
                param.copy_(new_param)
            else:
                where = active.view(shape)
                self.exp_avg[name] = th.where(where, exp_avg, self.exp_avg[name])
                self.exp_avg_sq[name] = th.where(where, exp_avg_sq, self.exp_avg_sq[name])
                param.copy_(th.where(where, new_param, param))
            self.step_count[name] = step

    def scatter(self) -> None:
        """Write each member's moments and step count back into its own optimizer (members that never stepped keep
        an empty state, as torch's Adam does)."""
        for index, policy in enumerate(self.policies):
            for name, parameter in policy.named_parameters():
                step = self.step_count[name][index]
                if step.item() == 0:
                    continue
                policy.optimizer.state[parameter] = {
                    "step": step.clone(),
                    "exp_avg": self.exp_avg[name][index].clone(),
                    "exp_avg_sq": self.exp_avg_sq[name][index].clone(),
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


def _clip_grad_norms(params: dict[str, th.Tensor], max_grad_norm: float) -> None:
    """``clip_grad_norm_`` of every member's gradients on its own: each member's total norm over all its tensors."""
    grads = [param.grad for param in params.values()]
    norms = th.stack([th.linalg.vector_norm(grad.flatten(1), dim=1) for grad in grads if grad is not None], dim=1)
    total_norm = th.linalg.vector_norm(norms, dim=1)
    clip_coef = th.clamp(max_grad_norm / (total_norm + 1e-6), max=1.0)
    for grad in grads:
        if grad is not None:
            grad.mul_(clip_coef.view((-1,) + (1,) * (grad.dim() - 1)))


def _minibatch_index(
    batch: StackedBatch, shuffle: bool, generators: Sequence[th.Generator | None] | None, device: th.device
) -> th.Tensor:
    """``(n_members, length)``: the order of each member's rows in this pass, its padding last."""
    length = batch.mask.shape[1]
    orders = []
    for index, n in enumerate(batch.lengths):
        if shuffle:
            generator = None if generators is None else generators[index]
            order = th.randperm(n, generator=generator)
        else:
            order = th.arange(n)
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
    params = {name: p.clone().requires_grad_(True) for name, p in stacked.gather().items()}
    optimizer = StackedAdam(params, stacked.policies)
    advantages = _normalized_advantages(batch, normalize_advantage)
    length = batch.mask.shape[1]
    minibatch_size = length if batch_size is None else batch_size

    with th.no_grad():
        before = _stacked_losses(stacked, params, batch, advantages, batch.mask, clip_range, clip_range_vf)

    active = th.ones(n_members, dtype=th.bool, device=device)
    n_epochs_run = th.zeros(n_members, dtype=th.long, device=device)
    for _ in range(n_epochs):
        if not bool(active.any()):
            break
        order = _minibatch_index(batch, shuffle_minibatches, generators, device)
        stepped = th.zeros(n_members, dtype=th.bool, device=device)
        for start in range(0, length, minibatch_size):
            index = order[:, start : start + minibatch_size]
            minibatch = batch.take(index)
            has_rows = minibatch.mask.any(dim=1) & active
            if not bool(has_rows.any()):
                break
            mask = minibatch.mask & has_rows[:, None]
            losses = _stacked_losses(
                stacked, params, minibatch, advantages.gather(1, index), mask, clip_range, clip_range_vf
            )
            too_far = has_rows & (losses.approx_kl > 1.5 * target_kl) if target_kl is not None else th.zeros_like(has_rows)
            steps = has_rows & ~too_far if kl_stop == "before_step" else has_rows
            if bool(steps.any()):
                loss = losses.policy_loss + ent_coef * losses.entropy_loss + vf_coef * losses.value_loss
                for param in params.values():
                    param.grad = None
                (loss * steps.float()).sum().backward()
                if max_grad_norm is not None:
                    _clip_grad_norms(params, max_grad_norm)
                optimizer.step(steps)
                stepped |= steps
            active &= ~too_far
        n_epochs_run += stepped.long()

    with th.no_grad():
        for param in params.values():
            param.grad = None
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
