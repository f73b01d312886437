"""The PPO update of one agent's policy on its training batch (:mod:`sb3_ippo.update.batch`).

:func:`ppo_update` runs up to ``n_epochs`` passes of clipped-surrogate PPO over sequential minibatches, with SB3's
loss conventions, stopping all remaining passes once a minibatch's approximate KL exceeds ``1.5 * target_kl``
(checked after that minibatch's gradient step, as the reference does, or before it, as SB3 does: ``kl_stop``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch as th
from stable_baselines3.common.policies import ActorCriticPolicy, BasePolicy
from stable_baselines3.common.utils import explained_variance
from torch.nn import functional as F

from sb3_ippo.update.batch import AgentBatch
from sb3_ippo.update.settings import UpdateSettings


@dataclass
class UpdateStats:
    """What one agent's update did, measured on its whole batch before and after the update."""

    policy_loss: float
    policy_loss_delta: float
    value_loss: float
    value_loss_delta: float
    approx_kl: float
    entropy_loss: float
    clip_fraction: float
    explained_variance: float
    n_epochs_run: int
    n_transitions: int
    n_trajectories: int


@dataclass
class _Losses:
    policy_loss: th.Tensor
    value_loss: th.Tensor
    entropy_loss: th.Tensor
    approx_kl: th.Tensor
    clip_fraction: th.Tensor
    values: th.Tensor


def _losses(
    policy: ActorCriticPolicy, batch: AgentBatch, advantages: th.Tensor, clip_range: float, clip_range_vf: float | None
) -> _Losses:
    """SB3 PPO's losses on ``batch`` (with gradients, when enabled)."""
    values, log_prob, entropy = policy.evaluate_actions(batch.observations, batch.actions)
    return surrogate_losses(values.flatten(), log_prob, entropy, batch, advantages, clip_range, clip_range_vf)


def surrogate_losses(
    values: th.Tensor,
    log_prob: th.Tensor,
    entropy: th.Tensor | None,
    batch: AgentBatch,
    advantages: th.Tensor,
    clip_range: float,
    clip_range_vf: float | None,
) -> _Losses:
    """SB3 PPO's losses from the policy's outputs on ``batch``'s rows (values flat, one per row); the recurrent update
    (:mod:`sb3_ippo.update.recurrent`) evaluates its sequences its own way and shares these."""
    log_ratio = log_prob - batch.old_log_prob
    ratio = th.exp(log_ratio)
    policy_loss = -th.min(advantages * ratio, advantages * th.clamp(ratio, 1 - clip_range, 1 + clip_range)).mean()
    if clip_range_vf is None:
        values_pred = values
    else:
        values_pred = batch.old_values + th.clamp(values - batch.old_values, -clip_range_vf, clip_range_vf)
    value_loss = F.mse_loss(batch.returns, values_pred)
    # Without an analytic entropy, approximate it by -log pi(a|s), as SB3 does.
    entropy_loss = -th.mean(-log_prob) if entropy is None else -th.mean(entropy)
    with th.no_grad():
        approx_kl = th.mean((ratio - 1) - log_ratio)
        clip_fraction = th.mean((th.abs(ratio - 1) > clip_range).float())
    return _Losses(policy_loss, value_loss, entropy_loss, approx_kl, clip_fraction, values)


def update_stats(before: _Losses, after: _Losses, batch: AgentBatch, n_epochs_run: int) -> UpdateStats:
    """An update's statistics: the losses on the whole batch after it, their change from ``before`` it, and
    the batch's size."""
    return UpdateStats(
        policy_loss=after.policy_loss.item(),
        policy_loss_delta=(after.policy_loss - before.policy_loss).item(),
        value_loss=after.value_loss.item(),
        value_loss_delta=(after.value_loss - before.value_loss).item(),
        approx_kl=after.approx_kl.item(),
        entropy_loss=after.entropy_loss.item(),
        clip_fraction=after.clip_fraction.item(),
        explained_variance=float(explained_variance(batch.old_values.cpu().numpy(), batch.returns.cpu().numpy())),
        n_epochs_run=n_epochs_run,
        n_transitions=len(batch),
        n_trajectories=batch.n_trajectories,
    )


def gradient_passes(policy: BasePolicy, settings: UpdateSettings, epoch_losses: Callable[[], Iterator[_Losses]]) -> int:
    """Up to ``settings.n_epochs`` passes, each a gradient step of the policy's optimizer on every minibatch's losses
    that ``epoch_losses()`` yields (a generator: each minibatch is evaluated after the previous step), with gradient
    clipping and the KL early stop described in :func:`ppo_update`. Returns the passes that made at least one step
    (``n_epochs_run``). Shared by the feed-forward and the recurrent update."""
    target_kl = settings.target_kl
    n_epochs_run = 0
    for _ in range(settings.n_epochs):
        stop = stepped = False
        for losses in epoch_losses():
            stop = target_kl is not None and losses.approx_kl.item() > 1.5 * target_kl
            if stop and settings.kl_stop == "before_step":
                break
            loss = losses.policy_loss + settings.ent_coef * losses.entropy_loss + settings.vf_coef * losses.value_loss
            policy.optimizer.zero_grad()
            loss.backward()
            if settings.max_grad_norm is not None:
                th.nn.utils.clip_grad_norm_(policy.parameters(), settings.max_grad_norm)
            policy.optimizer.step()
            stepped = True
            if stop:
                break
        n_epochs_run += int(stepped)
        if stop:
            break
    return n_epochs_run


def ppo_update(
    policy: ActorCriticPolicy, batch: AgentBatch, settings: UpdateSettings, generator: th.Generator | None = None
) -> UpdateStats:
    """Up to ``settings.n_epochs`` passes of PPO over ``batch`` with the policy's own optimizer, at its current
    learning rate. ``settings`` holds no schedule here: the caller reads them (``UpdateSettings.at``).

    Minibatches of ``batch_size`` (None: the whole batch) are taken in stored order, or shuffled each pass with
    ``shuffle_minibatches`` (permutations drawn from ``generator``, a CPU generator; None: torch's global one).
    Advantages are normalized once over the whole batch.

    The KL early stop compares the minibatch's approximate KL (from the forward pass of its loss, before its
    gradient step) with ``1.5 * target_kl``. With ``kl_stop="after_step"`` (the reference), the minibatch's step is
    taken and then, above the threshold, all remaining passes are stopped; with ``"before_step"`` (SB3's PPO), the
    step is skipped and all remaining passes are stopped. Either way ``n_epochs_run`` counts the passes that made at
    least one gradient step: the reference's StopIter after a stop, SB3's count of completed steps' passes.
    """
    clip_range, clip_range_vf = settings.clip_range, settings.clip_range_vf
    assert not callable(clip_range) and not callable(clip_range_vf), "read the schedules first: UpdateSettings.at"
    advantages = batch.advantages
    if settings.normalize_advantage and len(advantages) > 1:
        advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
    n_transitions = len(batch)
    minibatch_size = n_transitions if settings.batch_size is None else settings.batch_size

    with th.no_grad():
        before = _losses(policy, batch, advantages, clip_range, clip_range_vf)

    def epoch_losses() -> Iterator[_Losses]:
        order = th.randperm(n_transitions, generator=generator).to(advantages.device) if settings.shuffle_minibatches else None
        for start in range(0, n_transitions, minibatch_size):
            end = start + minibatch_size
            indices = slice(start, end) if order is None else order[start:end]
            yield _losses(policy, batch.select(indices), advantages[indices], clip_range, clip_range_vf)

    policy.set_training_mode(True)
    n_epochs_run = gradient_passes(policy, settings, epoch_losses)
    policy.set_training_mode(False)
    with th.no_grad():
        after = _losses(policy, batch, advantages, clip_range, clip_range_vf)
    return update_stats(before, after, batch, n_epochs_run)
