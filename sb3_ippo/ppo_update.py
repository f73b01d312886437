"""The PPO update of one agent's policy on a batch of its drained trajectories.

The update runs in two steps, each a function:

1. :func:`build_batch` -- fresh-value GAE: recompute V(s) for every observation and bootstrap observation with
   the agent's *current* value network (and log pi_old(a|s) with its current policy), then compute GAE.
2. :func:`ppo_update` -- up to ``n_epochs`` passes of clipped-surrogate PPO over sequential minibatches, with
   SB3's loss conventions, stopping all remaining passes once a minibatch's approximate KL exceeds
   ``1.5 * target_kl`` (checked after that minibatch's gradient step, as the reference does, or before it, as
   SB3 does: ``kl_stop``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch as th
from gymnasium import spaces
from stable_baselines3.common.policies import ActorCriticPolicy
from stable_baselines3.common.utils import explained_variance, obs_as_tensor
from torch.nn import functional as F

from sb3_ippo.buffer import Trajectory, concat_obs, stack_obs
from sb3_ippo.normalization import ReturnNormalizer
from sb3_ippo.vec_env import ObsArray

TensorObs = th.Tensor | dict[str, th.Tensor]
KLStop = Literal["after_step", "before_step"]
KL_STOPS: tuple[KLStop, ...] = ("after_step", "before_step")


def compute_gae(
    rewards: np.ndarray,
    values: np.ndarray,
    bootstrap_values: np.ndarray,
    lengths: Sequence[int],
    gamma: float,
    gae_lambda: float,
) -> tuple[np.ndarray, np.ndarray]:
    """Generalized advantage estimation over trajectories laid end to end.

    :param rewards: ``(T,)`` rewards of all trajectories, concatenated.
    :param values: ``(T,)`` V(s_t) on the return scale.
    :param bootstrap_values: ``(n_trajectories,)`` the value after each trajectory's last step: 0 for a
        terminated trajectory, V(s_T) for a truncated or cut one.
    :param lengths: The trajectories' lengths, summing to T.
    :return: advantages and returns (``advantages + values``), each ``(T,)``.
    """
    ends = np.cumsum(lengths) - 1
    next_values = np.empty_like(values)
    next_values[:-1] = values[1:]
    next_values[ends] = bootstrap_values
    continues = np.ones_like(values)
    continues[ends] = 0.0
    deltas = rewards + gamma * next_values - values
    decay = gamma * gae_lambda * continues
    advantages = np.zeros_like(values)
    last_advantage = 0.0
    for t in range(len(rewards) - 1, -1, -1):
        last_advantage = deltas[t] + decay[t] * last_advantage
        advantages[t] = last_advantage
    return advantages, advantages + values


@dataclass
class AgentBatch:
    """One agent's training batch, in stored order (trajectories end to end). Tensors on the policy's device.

    ``old_values`` (the values GAE used) and ``returns`` (the value targets) are on the value head's scale: with
    return normalization, both are normalized with the statistics as updated by this batch's returns, the scale the
    head is trained towards and read back with at the next update.
    """

    observations: TensorObs
    actions: th.Tensor
    old_log_prob: th.Tensor
    old_values: th.Tensor
    advantages: th.Tensor
    returns: th.Tensor
    n_trajectories: int

    def __len__(self) -> int:
        return len(self.advantages)

    def select(self, indices: slice | th.Tensor) -> AgentBatch:
        observations = (
            {key: obs[indices] for key, obs in self.observations.items()}
            if isinstance(self.observations, dict)
            else self.observations[indices]
        )
        return AgentBatch(
            observations=observations,
            actions=self.actions[indices],
            old_log_prob=self.old_log_prob[indices],
            old_values=self.old_values[indices],
            advantages=self.advantages[indices],
            returns=self.returns[indices],
            n_trajectories=self.n_trajectories,
        )


def actions_as_tensor(actions: np.ndarray, action_space: spaces.Space, device: th.device) -> th.Tensor:
    """Actions in the form ``ActorCriticPolicy.evaluate_actions`` takes (SB3 PPO's conventions)."""
    tensor = th.as_tensor(actions, device=device)
    if isinstance(action_space, spaces.Discrete):
        return tensor.long().flatten()
    if isinstance(action_space, spaces.MultiDiscrete):
        return tensor.long().reshape(len(tensor), -1)
    return tensor.float().reshape(len(tensor), -1)


@dataclass
class DrainedBatch:
    """One agent's drained trajectories as the networks take them, before any network has seen them.

    ``observations`` (preprocessed with the agent's normalization and image layout) and ``actions`` are tensors on
    the policy's device, trajectories end to end; ``bootstrap_obs`` holds the observation after each trajectory
    listed in ``bootstrapped`` (the trajectories that bootstrap from V(s_T)), None if there is none.
    """

    observations: TensorObs
    actions: th.Tensor
    rewards: np.ndarray
    lengths: list[int]
    stored_values: np.ndarray
    stored_log_probs: th.Tensor
    bootstrapped: list[int]
    bootstrap_obs: TensorObs | None

    def __len__(self) -> int:
        return len(self.rewards)


def drain_to_tensors(
    trajectories: Sequence[Trajectory],
    action_space: spaces.Space,
    device: th.device,
    preprocess_obs: Callable[[ObsArray], ObsArray] | None = None,
    time_limit_bootstrap: bool = True,
) -> DrainedBatch:
    """Lay ``trajectories`` end to end, with observations (and bootstrap observations) through ``preprocess_obs``.

    A cut trajectory bootstraps from V(s_T), and so does a truncated one unless ``time_limit_bootstrap`` is False
    (it then bootstraps 0, as if terminated); a terminated one bootstraps 0.
    """

    def as_policy_tensor(obs: ObsArray) -> TensorObs:
        return obs_as_tensor(preprocess_obs(obs) if preprocess_obs is not None else obs, device)

    bootstrapped = [
        i for i, t in enumerate(trajectories) if not (t.terminated or (t.truncated and not time_limit_bootstrap))
    ]
    return DrainedBatch(
        observations=as_policy_tensor(concat_obs([trajectory.observations for trajectory in trajectories])),
        actions=actions_as_tensor(np.concatenate([t.actions for t in trajectories]), action_space, device),
        rewards=np.concatenate([trajectory.rewards for trajectory in trajectories]),
        lengths=[len(trajectory) for trajectory in trajectories],
        stored_values=np.concatenate([trajectory.values for trajectory in trajectories]),
        stored_log_probs=th.as_tensor(np.concatenate([t.log_probs for t in trajectories]), device=device),
        bootstrapped=bootstrapped,
        bootstrap_obs=(
            as_policy_tensor(stack_obs([trajectories[i].bootstrap_obs for i in bootstrapped])) if bootstrapped else None
        ),
    )


def finish_batch(
    drained: DrainedBatch,
    fresh_values: th.Tensor | None,
    fresh_log_prob: th.Tensor | None,
    bootstrap_head_values: th.Tensor | None,
    gamma: float,
    gae_lambda: float,
    return_normalizer: ReturnNormalizer | None = None,
) -> AgentBatch:
    """GAE and value targets from the networks' outputs on ``drained``: :func:`build_batch` after its forward passes.

    :param fresh_values: Value-head outputs on the observations (None: use the stored values).
    :param fresh_log_prob: log pi(a|s) from the current policy (None: use the stored log-probs).
    :param bootstrap_head_values: Value-head outputs on the bootstrap observations (None when there are none).
    """
    device = drained.actions.device
    bootstrap_values = np.zeros(len(drained.lengths), dtype=np.float32)
    if drained.bootstrapped:
        assert bootstrap_head_values is not None
        bootstrap_values[drained.bootstrapped] = bootstrap_head_values.cpu().numpy()
    if fresh_values is not None:
        values = fresh_values.cpu().numpy()
        if return_normalizer is not None:
            values = return_normalizer.denormalize(values)
    else:
        values = drained.stored_values
    if return_normalizer is not None:
        # Only network outputs are on the normalized scale: a terminated trajectory bootstraps 0 on the return scale.
        bootstrap_values[drained.bootstrapped] = return_normalizer.denormalize(bootstrap_values[drained.bootstrapped])
    advantages, returns = compute_gae(drained.rewards, values, bootstrap_values, drained.lengths, gamma, gae_lambda)
    if return_normalizer is not None:
        return_normalizer.update(returns)
        returns = return_normalizer.normalize(returns)
        values = return_normalizer.normalize(values)

    return AgentBatch(
        observations=drained.observations,
        actions=drained.actions,
        old_log_prob=(drained.stored_log_probs if fresh_log_prob is None else fresh_log_prob).float(),
        old_values=th.as_tensor(values, dtype=th.float32, device=device),
        advantages=th.as_tensor(advantages, dtype=th.float32, device=device),
        returns=th.as_tensor(returns, dtype=th.float32, device=device),
        n_trajectories=len(drained.lengths),
    )


@th.no_grad()
def recompute(policy: ActorCriticPolicy, observations: TensorObs, actions: th.Tensor) -> tuple[th.Tensor, th.Tensor]:
    """V(s) and log pi(a|s) under the current policy, in one batched forward pass."""
    values, log_prob, _ = policy.evaluate_actions(observations, actions)
    return values.flatten(), log_prob.flatten()


def build_batch(
    policy: ActorCriticPolicy,
    trajectories: Sequence[Trajectory],
    gamma: float,
    gae_lambda: float,
    recompute_values: bool = True,
    recompute_log_prob: bool = True,
    preprocess_obs: Callable[[ObsArray], ObsArray] | None = None,
    return_normalizer: ReturnNormalizer | None = None,
    time_limit_bootstrap: bool = True,
) -> AgentBatch:
    """Turn drained trajectories into a training batch, with fresh-value GAE.

    Observations (and bootstrap observations) go through ``preprocess_obs`` first: the agent's current
    normalization and image layout. With ``recompute_values``, V(s_t) and the bootstrap V(s_T) of every
    truncated or cut trajectory come from the current value network; otherwise the values stored at collection
    time are used (they are stored on the return scale, de-normalized with the statistics of their time; bootstrap
    values, never stored, still come from the current network). With ``time_limit_bootstrap=False``, a truncated
    trajectory bootstraps 0, as if terminated (:func:`drain_to_tensors`). With ``recompute_log_prob``, log
    pi_old(a|s) comes from the current policy, so the first minibatch's ratio is exactly 1. With
    ``return_normalizer``, value-head outputs are de-normalized before GAE; then the statistics are updated with the
    new returns, and the targets and the old values (for ``clip_range_vf`` and the explained variance) are both
    normalized with the updated statistics, the scale the value head is trained towards in this update and read back
    with at the next.
    """
    drained = drain_to_tensors(trajectories, policy.action_space, policy.device, preprocess_obs, time_limit_bootstrap)
    fresh_values = fresh_log_prob = bootstrap_values = None
    with th.no_grad():
        if recompute_values or recompute_log_prob:
            fresh_values, fresh_log_prob = recompute(policy, drained.observations, drained.actions)
        if drained.bootstrap_obs is not None:
            bootstrap_values = policy.predict_values(drained.bootstrap_obs).flatten()  # type: ignore[arg-type]
    return finish_batch(
        drained,
        fresh_values if recompute_values else None,
        fresh_log_prob if recompute_log_prob else None,
        bootstrap_values,
        gamma,
        gae_lambda,
        return_normalizer,
    )


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
    values = values.flatten()
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


def ppo_update(
    policy: ActorCriticPolicy,
    batch: AgentBatch,
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
    generator: th.Generator | None = None,
) -> UpdateStats:
    """Up to ``n_epochs`` passes of PPO over ``batch`` with the policy's own optimizer.

    Minibatches of ``batch_size`` (None: the whole batch) are taken in stored order, or shuffled each pass with
    ``shuffle_minibatches`` (permutations drawn from ``generator``, a CPU generator; None: torch's global one).
    Advantages are normalized once over the whole batch.

    The KL early stop compares the minibatch's approximate KL (from the forward pass of its loss, before its
    gradient step) with ``1.5 * target_kl``. With ``kl_stop="after_step"`` (the reference), the minibatch's step is
    taken and then, above the threshold, all remaining passes are stopped; with ``"before_step"`` (SB3's PPO), the
    step is skipped and all remaining passes are stopped. Either way ``n_epochs_run`` counts the passes that made at
    least one gradient step: the reference's StopIter after a stop, SB3's count of completed steps' passes.
    """
    if kl_stop not in KL_STOPS:
        raise ValueError(f"kl_stop must be one of {KL_STOPS}, got {kl_stop!r}")
    advantages = batch.advantages
    if normalize_advantage and len(advantages) > 1:
        advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
    n_transitions = len(batch)
    minibatch_size = n_transitions if batch_size is None else batch_size

    with th.no_grad():
        before = _losses(policy, batch, advantages, clip_range, clip_range_vf)

    policy.set_training_mode(True)
    n_epochs_run = 0
    stop = False
    for _ in range(n_epochs):
        order = th.randperm(n_transitions, generator=generator).to(advantages.device) if shuffle_minibatches else None
        stepped = False
        for start in range(0, n_transitions, minibatch_size):
            end = start + minibatch_size
            indices = slice(start, end) if order is None else order[start:end]
            minibatch = batch.select(indices)
            losses = _losses(policy, minibatch, advantages[indices], clip_range, clip_range_vf)
            stop = target_kl is not None and losses.approx_kl.item() > 1.5 * target_kl
            if stop and kl_stop == "before_step":
                break
            loss = losses.policy_loss + ent_coef * losses.entropy_loss + vf_coef * losses.value_loss
            policy.optimizer.zero_grad()
            loss.backward()
            if max_grad_norm is not None:
                th.nn.utils.clip_grad_norm_(policy.parameters(), max_grad_norm)
            policy.optimizer.step()
            stepped = True
            if stop:
                break
        n_epochs_run += int(stepped)
        if stop:
            break

    policy.set_training_mode(False)
    with th.no_grad():
        after = _losses(policy, batch, advantages, clip_range, clip_range_vf)
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
        n_transitions=n_transitions,
        n_trajectories=batch.n_trajectories,
    )
