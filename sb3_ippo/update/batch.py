"""A group member's training batch from its drained trajectories: fresh-value GAE.

:func:`build_batch` recomputes V(s) for every observation and bootstrap observation with the agent's *current* value
network (and log pi_old(a|s) with its current policy), then computes GAE (:func:`compute_gae`) and the value targets,
on the value head's scale. The batched path (:mod:`sb3_ippo.update.stacked_update`) shares the two halves around the
forward pass: :func:`drain_to_tensors` before, :func:`finish_batch` after.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch as th
from gymnasium import spaces
from stable_baselines3.common.policies import ActorCriticPolicy
from stable_baselines3.common.utils import obs_as_tensor

from sb3_ippo.common.buffer import Trajectory, concat_obs, stack_obs
from sb3_ippo.common.normalization import ReturnNormalizer
from sb3_ippo.common.type_aliases import ObsArray
from sb3_ippo.update.settings import UpdateSettings

TensorObs = th.Tensor | dict[str, th.Tensor]


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
    settings: UpdateSettings,
    return_normalizer: ReturnNormalizer | None = None,
) -> AgentBatch:
    """GAE and value targets from the networks' outputs on ``drained``: :func:`build_batch` after its forward passes.

    :param fresh_values: Value-head outputs on the observations, used with ``settings.recompute_values`` (else, or
        None: the stored values).
    :param fresh_log_prob: log pi(a|s) from the current policy, used with ``settings.recompute_log_prob`` (else, or
        None: the stored log-probs).
    :param bootstrap_head_values: Value-head outputs on the bootstrap observations (None when there are none).
    """
    if not settings.recompute_values:
        fresh_values = None
    if not settings.recompute_log_prob:
        fresh_log_prob = None
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
    advantages, returns = compute_gae(
        drained.rewards, values, bootstrap_values, drained.lengths, settings.gamma, settings.gae_lambda
    )
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
    settings: UpdateSettings,
    preprocess_obs: Callable[[ObsArray], ObsArray] | None = None,
    return_normalizer: ReturnNormalizer | None = None,
) -> AgentBatch:
    """Turn drained trajectories into a training batch, with fresh-value GAE (``settings.gamma``, ``gae_lambda``).

    Observations (and bootstrap observations) go through ``preprocess_obs`` first: the agent's current
    normalization and image layout. With ``settings.recompute_values``, V(s_t) and the bootstrap V(s_T) of every
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
    drained = drain_to_tensors(
        trajectories, policy.action_space, policy.device, preprocess_obs, settings.time_limit_bootstrap
    )
    fresh_values = fresh_log_prob = bootstrap_values = None
    with th.no_grad():
        if settings.recompute_values or settings.recompute_log_prob:
            fresh_values, fresh_log_prob = recompute(policy, drained.observations, drained.actions)
        if drained.bootstrap_obs is not None:
            bootstrap_values = policy.predict_values(drained.bootstrap_obs).flatten()  # type: ignore[arg-type]
    return finish_batch(drained, fresh_values, fresh_log_prob, bootstrap_values, settings, return_normalizer)
