"""The update of a stacked group (:mod:`sb3_ippo.update.stacked`): every member's batch, padded to one length, and
every minibatch as one forward, one backward, one gradient clip and one Adam step for the whole group (on one
``(members, parameters)`` tensor, :class:`FlatParameters`).

:func:`stacked_ppo_update` follows :func:`sb3_ippo.update.ppo.ppo_update` step for step for every member -- the same
minibatches, losses, gradient clipping, Adam arithmetic and KL early stop (a member that stopped takes no further
step: its parameters and optimizer state stay exactly as they were) -- so that both paths give the same parameters
(tests check it to 1e-5). Frozen parameters (``requires_grad=False``) are left alone, as the reference path's
optimizer leaves them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch as th
from stable_baselines3.common.policies import ActorCriticPolicy
from stable_baselines3.common.utils import explained_variance

from sb3_ippo.common.buffer import Trajectory
from sb3_ippo.common.normalization import ReturnNormalizer
from sb3_ippo.common.type_aliases import ObsArray
from sb3_ippo.update.batch import AgentBatch, DrainedBatch, TensorObs, drain_to_tensors, finish_batch
from sb3_ippo.update.ppo import UpdateStats
from sb3_ippo.update.settings import UpdateSettings
from sb3_ippo.update.stacked import StackedPolicies, concat_tensor_obs

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
    settings: UpdateSettings,
    preprocess_obs: Sequence[Callable[[ObsArray], ObsArray] | None] | None = None,
    return_normalizers: Sequence[ReturnNormalizer] | None = None,
) -> StackedBatch:
    """:func:`sb3_ippo.update.batch.build_batch` for every member (``trajectories[i]`` are member ``i``'s), with the
    recomputation of values, log-probs and bootstrap values in one forward pass for the whole group."""
    policies = stacked.policies
    drained: list[DrainedBatch] = [
        drain_to_tensors(
            member,
            policy.action_space,
            policy.device,
            None if preprocess_obs is None else preprocess_obs[i],
            settings.time_limit_bootstrap,
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
                values[i, :n],
                log_prob[i, :n],
                values[i, n : n + len(member.bootstrapped)] if member.bootstrapped else None,
                settings,
                None if return_normalizers is None else return_normalizers[i],
            )
        )
    return StackedBatch.from_batches(batches)


# ------------------------------------------------------------------------------------------------------------------
# The update
# ------------------------------------------------------------------------------------------------------------------


class FlatParameters:
    """The members' trainable parameters as one ``(n_members, n_parameters)`` leaf tensor, so that the whole group's
    gradient clipping and Adam step are a handful of tensor operations. :meth:`as_dict` splits it (differentiably) into
    the named, stacked parameters the networks take, with the frozen ones (not in ``trainable``) as constants; its
    backward pass concatenates the trainable ones' gradients into ``flat.grad``."""

    def __init__(self, params: dict[str, th.Tensor], trainable: Sequence[str]) -> None:
        self.names = list(trainable)
        self.frozen = {name: value for name, value in params.items() if name not in self.names}
        self.shapes = [params[name].shape[1:] for name in self.names]
        self.sizes = [shape.numel() for shape in self.shapes]
        n_members = next(iter(params.values())).shape[0]
        self.flat = th.cat([params[name].reshape(n_members, -1) for name in self.names], dim=1).requires_grad_(True)

    def as_dict(self, flat: th.Tensor | None = None) -> dict[str, th.Tensor]:
        """The named parameters: the trainable ones split from ``flat`` (default: the parameters), and the frozen."""
        return {**self.frozen, **self.trainable(self.flat if flat is None else flat)}

    def trainable(self, flat: th.Tensor) -> dict[str, th.Tensor]:
        """``flat`` (the parameters, or a tensor laid out as they are: Adam's moments) split into the trainable names."""
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
        exp_avg, exp_avg_sq = self.flat.trainable(self.exp_avg), self.flat.trainable(self.exp_avg_sq)
        for index, policy in enumerate(self.policies):
            if self.steps[index] == 0:
                continue
            parameters = dict(policy.named_parameters())
            for name in self.flat.names:
                parameter = parameters[name]
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
    settings: UpdateSettings,
    generators: Sequence[th.Generator | None] | None = None,
) -> list[UpdateStats]:
    """:func:`sb3_ippo.update.ppo.ppo_update` of every member at once: the same minibatches of each member's own
    batch, the same losses, per-member gradient clipping and Adam, and each member's own KL early stop.

    With ``shuffle_minibatches``, member ``i``'s permutations are drawn from ``generators[i]``.
    """
    clip_range, clip_range_vf, target_kl = settings.clip_range, settings.clip_range_vf, settings.target_kl
    assert not callable(clip_range) and not callable(clip_range_vf), "read the schedules first: UpdateSettings.at"
    n_members = stacked.n_members
    device = batch.mask.device
    flat = FlatParameters(stacked.gather(), stacked.trainable)
    optimizer = StackedAdam(flat, stacked.policies)
    advantages = _normalized_advantages(batch, settings.normalize_advantage)
    length = batch.mask.shape[1]
    minibatch_size = length if settings.batch_size is None else settings.batch_size

    with th.no_grad():
        before = _stacked_losses(stacked, flat.as_dict(), batch, advantages, batch.mask, clip_range, clip_range_vf)

    active = [True] * n_members
    n_epochs_run = [0] * n_members
    for _ in range(settings.n_epochs):
        if not any(active):
            break
        order = _minibatch_index(batch, generators, device) if settings.shuffle_minibatches else None
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
            steps = [
                rows and not (far and settings.kl_stop == "before_step") for rows, far in zip(has_rows, too_far, strict=True)
            ]
            if any(steps):
                loss = losses.policy_loss + settings.ent_coef * losses.entropy_loss + settings.vf_coef * losses.value_loss
                stepping = th.tensor(steps, device=device)
                flat.flat.grad = None
                # Selected, not weighted by 0: a member that takes no step gets a gradient of exactly 0 (0 * inf is NaN).
                th.where(stepping, loss, 0.0).sum().backward()
                assert flat.flat.grad is not None
                flat.flat.grad.masked_fill_(~stepping[:, None], 0.0)
                if settings.max_grad_norm is not None:
                    _clip_grad_norms(flat.flat, settings.max_grad_norm)
                optimizer.step(steps)
                stepped = [done or now for done, now in zip(stepped, steps, strict=True)]
            active = [on and not far for on, far in zip(active, too_far, strict=True)]
        n_epochs_run = [count + done for count, done in zip(n_epochs_run, stepped, strict=True)]

    with th.no_grad():
        flat.flat.grad = None
        params = flat.as_dict()
        after = _stacked_losses(stacked, params, batch, advantages, batch.mask, clip_range, clip_range_vf)
        stacked.scatter(flat.trainable(flat.flat))
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
