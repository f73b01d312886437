"""The maths of the update, checked against independent references.

GAE against SB3's ``RolloutBuffer.compute_returns_and_advantage``; one PPO update against a hand-written PPO step
with SB3's loss conventions; fresh values and log-probs; the KL early stop; the normalizers.
"""

from __future__ import annotations

import copy
import pickle
from typing import Any

import numpy as np
import pytest
import torch as th
from gymnasium import spaces
from stable_baselines3.common.buffers import RolloutBuffer
from stable_baselines3.common.policies import ActorCriticPolicy, MultiInputActorCriticPolicy
from stable_baselines3.common.running_mean_std import RunningMeanStd

from sb3_ippo.common.buffer import Trajectory, stack_obs
from sb3_ippo.common.normalization import ObservationNormalizer, ReturnNormalizer
from sb3_ippo.update.batch import build_batch, compute_gae
from sb3_ippo.update.ppo import ppo_update
from tests.helpers import GAE_LAMBDA, GAMMA, sampled_trajectories, settings

OBS_SPACE = spaces.Box(-1.0, 1.0, (4,), np.float32)


def make_policy(
    observation_space: spaces.Space = OBS_SPACE,
    action_space: spaces.Space | None = None,
    learning_rate: float = 3e-4,
    seed: int = 0,
) -> ActorCriticPolicy:
    th.manual_seed(seed)
    policy_class = MultiInputActorCriticPolicy if isinstance(observation_space, spaces.Dict) else ActorCriticPolicy
    return policy_class(observation_space, action_space or spaces.Discrete(3), lambda _: learning_rate, net_arch=[16])


def make_trajectory(
    rng: np.random.Generator,
    length: int,
    terminated: bool,
    observation_space: spaces.Space = OBS_SPACE,
    action_space: spaces.Space | None = None,
    stored_value: float = 0.0,
    stored_log_prob: float = 0.0,
) -> Trajectory:
    """A trajectory of random observations, actions and rewards, with constant stored values and log-probs."""
    action_space = action_space or spaces.Discrete(3)
    observation_space.seed(int(rng.integers(2**31)))
    action_space.seed(int(rng.integers(2**31)))
    return Trajectory(
        observations=stack_obs([observation_space.sample() for _ in range(length)]),
        actions=np.stack([np.asarray(action_space.sample()) for _ in range(length)]),
        rewards=rng.normal(size=length).astype(np.float32),
        values=np.full(length, stored_value, dtype=np.float32),
        log_probs=np.full(length, stored_log_prob, dtype=np.float32),
        terminated=terminated,
        bootstrap_obs=None if terminated else observation_space.sample(),
        policy_version=0,
    )


def make_trajectories(ends: list[tuple[int, bool]], seed: int = 0, **kwargs) -> list[Trajectory]:
    """``ends``: (length, terminated) of each trajectory."""
    rng = np.random.default_rng(seed)
    return [make_trajectory(rng, length, terminated, **kwargs) for length, terminated in ends]


@th.no_grad()
def network_values(policy: ActorCriticPolicy, observations: np.ndarray) -> np.ndarray:
    return policy.predict_values(th.as_tensor(observations)).flatten().numpy()


def sb3_gae(
    rewards: np.ndarray,
    values: np.ndarray,
    lengths: list[int],
    terminated: list[bool],
    bootstrap_values: list[float],
    last_is_rollout_end: bool = False,
    gamma: float = GAMMA,
    gae_lambda: float = GAE_LAMBDA,
) -> tuple[np.ndarray, np.ndarray]:
    """SB3's advantages and returns for trajectories laid end to end in one env, the way SB3 PPO collects them.

    A terminated trajectory is an episode end. A truncated one is an episode end whose last reward gets
    ``gamma * V(terminal observation)`` added (``OnPolicyAlgorithm.collect_rollouts``'s time-limit handling). With
    ``last_is_rollout_end``, the last trajectory is instead cut by the end of the rollout: SB3 bootstraps it with
    ``last_values`` and ``dones=False``.
    """
    rewards = rewards.astype(np.float32).copy()
    total = len(rewards)
    episode_starts = np.zeros(total, dtype=np.float32)
    ends = np.cumsum(lengths) - 1
    episode_starts[np.concatenate([[0], ends[:-1] + 1])] = 1.0
    for i, end in enumerate(ends):
        is_rollout_end = last_is_rollout_end and i == len(lengths) - 1
        if not terminated[i] and not is_rollout_end:
            rewards[end] += gamma * bootstrap_values[i]
    buffer = RolloutBuffer(
        total, spaces.Box(-1, 1, (1,)), spaces.Discrete(2), device="cpu", gae_lambda=gae_lambda, gamma=gamma, n_envs=1
    )
    for t in range(total):
        observation, action, value, log_prob = np.zeros((1, 1)), np.zeros((1, 1)), th.tensor([values[t]]), th.zeros(1)
        buffer.add(observation, action, rewards[t : t + 1], episode_starts[t : t + 1], value, log_prob)
    if last_is_rollout_end:
        last_values, last_done = bootstrap_values[-1], False
    else:
        # SB3 ignores last_values after an episode end: a nonsense value shows it.
        last_values, last_done = 1e6, True
    buffer.compute_returns_and_advantage(th.tensor([last_values]), np.array([last_done]))
    return buffer.advantages.flatten(), buffer.returns.flatten()


def gae_inputs(trajectories: list[Trajectory], values: np.ndarray, bootstrap_values: np.ndarray):
    return (
        np.concatenate([t.rewards for t in trajectories]),
        values,
        [len(t) for t in trajectories],
        [t.terminated for t in trajectories],
        list(bootstrap_values),
    )


def fresh_bootstrap_values(policy: ActorCriticPolicy, trajectories: list[Trajectory]) -> np.ndarray:
    """V(s_T) from the network for truncated trajectories, 0 for terminated ones."""
    return np.array(
        [0.0 if t.terminated else network_values(policy, t.bootstrap_obs[None])[0] for t in trajectories], dtype=np.float32
    )


# --- GAE against SB3's RolloutBuffer ---------------------------------------------------------------------------------


def test_gae_of_terminated_trajectories_equals_sb3_rollout_buffer() -> None:
    rng = np.random.default_rng(0)
    lengths = [5, 1, 7, 3]
    rewards = rng.normal(size=sum(lengths)).astype(np.float32)
    values = rng.normal(size=sum(lengths)).astype(np.float32)
    bootstrap_values = np.zeros(len(lengths), dtype=np.float32)

    advantages, returns = compute_gae(rewards, values, bootstrap_values, lengths, GAMMA, GAE_LAMBDA)

    expected_advantages, expected_returns = sb3_gae(rewards, values, lengths, [True] * 4, list(bootstrap_values))
    np.testing.assert_allclose(advantages, expected_advantages, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(returns, expected_returns, rtol=1e-5, atol=1e-6)


def test_gae_of_truncated_trajectories_equals_sb3_time_limit_bootstrap() -> None:
    rng = np.random.default_rng(1)
    lengths = [4, 6, 1, 5]
    terminated = [False, True, False, False]
    rewards = rng.normal(size=sum(lengths)).astype(np.float32)
    values = rng.normal(size=sum(lengths)).astype(np.float32)
    bootstrap_values = np.array([0.0 if done else rng.normal() * 3 for done in terminated], dtype=np.float32)

    advantages, returns = compute_gae(rewards, values, bootstrap_values, lengths, GAMMA, GAE_LAMBDA)

    expected_advantages, expected_returns = sb3_gae(rewards, values, lengths, terminated, list(bootstrap_values))
    np.testing.assert_allclose(advantages, expected_advantages, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(returns, expected_returns, rtol=1e-5, atol=1e-5)


def test_gae_of_a_cut_trajectory_equals_sb3_bootstrap_at_rollout_end() -> None:
    rng = np.random.default_rng(2)
    lengths = [3, 6]
    rewards = rng.normal(size=9).astype(np.float32)
    values = rng.normal(size=9).astype(np.float32)
    bootstrap_values = np.array([0.0, 2.5], dtype=np.float32)

    advantages, returns = compute_gae(rewards, values, bootstrap_values, lengths, GAMMA, GAE_LAMBDA)

    expected_advantages, expected_returns = sb3_gae(
        rewards, values, lengths, [True, False], list(bootstrap_values), last_is_rollout_end=True
    )
    np.testing.assert_allclose(advantages, expected_advantages, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(returns, expected_returns, rtol=1e-5, atol=1e-6)


def test_build_batch_gae_equals_sb3_for_trajectories_of_different_lengths() -> None:
    policy = make_policy()
    trajectories = make_trajectories([(7, True), (3, False), (1, True), (12, False), (5, True)])
    observations = np.concatenate([t.observations for t in trajectories])

    batch = build_batch(policy, trajectories, settings())

    values = network_values(policy, observations)
    expected_advantages, expected_returns = sb3_gae(
        *gae_inputs(trajectories, values, fresh_bootstrap_values(policy, trajectories))
    )
    np.testing.assert_allclose(batch.advantages.numpy(), expected_advantages, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(batch.returns.numpy(), expected_returns, rtol=1e-5, atol=1e-5)


def test_without_time_limit_bootstrap_a_truncated_trajectory_bootstraps_0_and_a_cut_one_still_bootstraps() -> None:
    policy = make_policy()
    trajectories = make_trajectories([(7, False), (3, True), (5, False), (4, False)])
    trajectories[0].truncated = trajectories[2].truncated = True  # time limits; the last one is cut by rollout_len
    values = network_values(policy, np.concatenate([t.observations for t in trajectories]))
    bootstrap_values = fresh_bootstrap_values(policy, trajectories)

    for time_limit_bootstrap, bootstraps in ((True, [True, False, True, True]), (False, [False, False, False, True])):
        batch = build_batch(policy, trajectories, settings(time_limit_bootstrap=time_limit_bootstrap))

        rewards, _, lengths, _, _ = gae_inputs(trajectories, values, bootstrap_values)
        expected_bootstrap = [v if b else 0.0 for v, b in zip(bootstrap_values, bootstraps, strict=True)]
        expected_advantages, expected_returns = sb3_gae(
            rewards, values, lengths, [not b for b in bootstraps], expected_bootstrap
        )
        np.testing.assert_allclose(batch.advantages.numpy(), expected_advantages, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(batch.returns.numpy(), expected_returns, rtol=1e-5, atol=1e-5)


# --- Fresh values ----------------------------------------------------------------------------------------------------


def test_advantages_come_from_the_current_value_network_not_the_stored_values() -> None:
    policy = make_policy()
    trajectories = make_trajectories([(6, False), (4, True)], stored_value=1000.0)
    observations = np.concatenate([t.observations for t in trajectories])

    batch = build_batch(policy, trajectories, settings(recompute_values=True))

    values = network_values(policy, observations)
    expected_advantages, _ = sb3_gae(*gae_inputs(trajectories, values, fresh_bootstrap_values(policy, trajectories)))
    np.testing.assert_allclose(batch.old_values.numpy(), values, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(batch.advantages.numpy(), expected_advantages, rtol=1e-5, atol=1e-5)


def test_advantages_follow_the_value_network_as_it_changes() -> None:
    policy = make_policy()
    trajectories = make_trajectories([(6, True)])
    before = build_batch(policy, trajectories, settings()).advantages
    with th.no_grad():
        policy.value_net.bias += 1.0

    after = build_batch(policy, trajectories, settings()).advantages

    # V + 1 everywhere except the terminal bootstrap (0): each TD error drops by 1 - gamma, the last one by 1.
    lengths, decay = 6, GAMMA * GAE_LAMBDA
    expected_shift = np.array([-(1 - GAMMA) * sum(decay**k for k in range(lengths - 1 - t)) for t in range(lengths)])
    expected_shift -= decay ** np.arange(lengths - 1, -1, -1)
    np.testing.assert_allclose((after - before).numpy(), expected_shift, rtol=1e-4, atol=1e-5)


def test_stored_values_are_used_when_recompute_values_is_off() -> None:
    policy = make_policy()
    trajectories = make_trajectories([(6, False), (4, True)], stored_value=1000.0)

    batch = build_batch(policy, trajectories, settings(recompute_values=False))

    stored = np.concatenate([t.values for t in trajectories])
    # Bootstrap values are never stored: they still come from the network.
    expected_advantages, _ = sb3_gae(*gae_inputs(trajectories, stored, fresh_bootstrap_values(policy, trajectories)))
    np.testing.assert_array_equal(batch.old_values.numpy(), stored)
    np.testing.assert_allclose(batch.advantages.numpy(), expected_advantages, rtol=1e-5, atol=1e-3)


# --- Fresh log-probs -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("batch_size", [None, 4])
def test_recomputed_log_prob_makes_the_first_minibatch_ratio_exactly_one(batch_size: int | None) -> None:
    policy = make_policy()
    trajectories = make_trajectories([(6, False), (5, True)], stored_log_prob=-50.0)

    batch = build_batch(policy, trajectories, settings(recompute_log_prob=True))

    first = batch.select(slice(0, batch_size or len(batch)))
    policy.set_training_mode(True)
    with th.no_grad():
        _, log_prob, _ = policy.evaluate_actions(first.observations, first.actions)
    log_ratio = log_prob - first.old_log_prob
    ratio = th.exp(log_ratio)
    approx_kl = th.mean((ratio - 1) - log_ratio)
    assert th.equal(ratio, th.ones_like(ratio))
    assert approx_kl.item() == 0.0


def adam_steps(policy: ActorCriticPolicy) -> int:
    """How many optimizer steps the policy has taken (Adam counts them per parameter)."""
    steps = {int(state["step"]) for state in policy.optimizer.state.values()}
    assert len(steps) <= 1
    return steps.pop() if steps else 0


@pytest.mark.parametrize(("kl_stop", "expected_steps"), [("after_step", 2), ("before_step", 1)])
def test_recomputed_log_prob_lets_the_first_step_through_a_tiny_target_kl(kl_stop: str, expected_steps: int) -> None:
    policy = make_policy(learning_rate=1e-2)
    batch = build_batch(policy, make_trajectories([(8, False), (8, True)], stored_log_prob=-50.0), settings())

    stats = ppo_update(policy, batch, settings(n_epochs=10, target_kl=1e-09, kl_stop=kl_stop))  # type: ignore[arg-type]

    # The first pass sees KL 0 and steps. The second sees the changed policy: the reference takes that step and
    # then stops (StopIter 2); SB3 stops before it.
    assert stats.n_epochs_run == expected_steps
    assert adam_steps(policy) == expected_steps


@pytest.mark.parametrize(("kl_stop", "expected_steps"), [("after_step", 1), ("before_step", 0)])
def test_stored_log_prob_is_used_when_recompute_log_prob_is_off(kl_stop: str, expected_steps: int) -> None:
    policy = make_policy(learning_rate=1e-2)
    trajectories = make_trajectories([(8, False), (8, True)], stored_log_prob=-50.0)
    batch = build_batch(policy, trajectories, settings(recompute_log_prob=False))
    initial = [p.detach().clone() for p in policy.parameters()]

    stats = ppo_update(policy, batch, settings(n_epochs=10, target_kl=1e-09, kl_stop=kl_stop))  # type: ignore[arg-type]

    # Stored log-probs far from the policy: the KL is huge at the first minibatch, which stops the update at once.
    assert th.equal(batch.old_log_prob, th.full((16,), -50.0))
    assert stats.n_epochs_run == expected_steps == adam_steps(policy)
    if expected_steps == 0:
        assert all(th.equal(p, p0) for p, p0 in zip(policy.parameters(), initial, strict=True))


def test_an_unknown_kl_stop_is_refused() -> None:
    policy = make_policy()
    batch = build_batch(policy, make_trajectories([(4, True)]), settings())
    with pytest.raises(ValueError, match="kl_stop"):
        ppo_update(policy, batch, settings(n_epochs=1, kl_stop='sometimes', target_kl=0.01))  # type: ignore[arg-type]


# --- KL early stop ---------------------------------------------------------------------------------------------------


def test_all_epochs_run_without_target_kl() -> None:
    policy = make_policy(learning_rate=0.5)
    batch = build_batch(policy, make_trajectories([(16, False), (16, True)]), settings())

    stats = ppo_update(policy, batch, settings(n_epochs=20, batch_size=8, target_kl=None))

    assert stats.n_epochs_run == 20


# --- One update against a hand-written PPO step ----------------------------------------------------------------------


def reference_ppo_update(
    policy: ActorCriticPolicy,
    trajectories: list[Trajectory],
    n_epochs: int,
    batch_size: int | None,
    learning_rate: float,
    clip_range: float,
    ent_coef: float,
    vf_coef: float,
    max_grad_norm: float,
    clip_range_vf: float | None,
    target_kl: float | None = None,
    kl_stop: str = "after_step",
) -> tuple[int, list[float]]:
    """PPO written out for a Box-observation, Discrete-action MLP policy: fresh values and log-probs, GAE per
    trajectory, advantages normalized over the batch, sequential minibatches, clipped surrogate + vf_coef * MSE
    (of the value clipped around the old value, with ``clip_range_vf``) - ent_coef * entropy, global gradient-norm
    clipping, Adam (SB3's eps=1e-5). The KL stop the way the reference writes it (``after_step``: step, then
    ``if mb_kl > 1.5 * target_kl: break``, StopIter = the pass it broke in) or SB3 does (``before_step``).

    :return: the passes that made a step, and every minibatch's approximate KL in order.
    """

    def forward(observations: th.Tensor) -> tuple[th.Tensor, th.Tensor]:
        log_pi = policy.action_net(policy.mlp_extractor.policy_net(observations)).log_softmax(dim=-1)
        value = policy.value_net(policy.mlp_extractor.value_net(observations)).squeeze(-1)
        return log_pi, value

    observations = th.as_tensor(np.concatenate([t.observations for t in trajectories]))
    actions = th.as_tensor(np.concatenate([t.actions for t in trajectories])).long()
    with th.no_grad():
        log_pi, values = forward(observations)
        old_log_prob = log_pi.gather(1, actions[:, None]).squeeze(1)
    advantages_list: list[float] = []
    start = 0
    for trajectory in trajectories:
        end = start + len(trajectory)
        if trajectory.terminated:
            next_value = 0.0
        else:
            with th.no_grad():
                next_value = forward(th.as_tensor(trajectory.bootstrap_obs[None]))[1].item()
        advantage, trajectory_advantages = 0.0, []
        for t in reversed(range(start, end)):
            delta = float(trajectory.rewards[t - start]) + GAMMA * next_value - values[t].item()
            advantage = delta + GAMMA * GAE_LAMBDA * advantage
            trajectory_advantages.append(advantage)
            next_value = values[t].item()
        advantages_list += trajectory_advantages[::-1]
        start = end
    advantages = th.tensor(advantages_list, dtype=th.float32)
    returns = advantages + values
    advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)

    optimizer = th.optim.Adam(policy.parameters(), lr=learning_rate, eps=1e-5)
    size = batch_size or len(advantages)
    kls: list[float] = []
    passes_run = 0
    for epoch in range(n_epochs):
        stop_iter = None
        for lo in range(0, len(advantages), size):
            mb = slice(lo, lo + size)
            log_pi, value = forward(observations[mb])
            log_prob = log_pi.gather(1, actions[mb, None]).squeeze(1)
            entropy = -(log_pi.exp() * log_pi).sum(dim=1)
            log_ratio = log_prob - old_log_prob[mb]
            ratio = log_ratio.exp()
            mb_kl = ((ratio - 1) - log_ratio).mean().item()
            kls.append(mb_kl)
            too_far = target_kl is not None and mb_kl > 1.5 * target_kl
            if too_far and kl_stop == "before_step":
                stop_iter = epoch if lo > 0 else epoch - 1
                break
            surrogate = th.min(advantages[mb] * ratio, advantages[mb] * ratio.clamp(1 - clip_range, 1 + clip_range))
            if clip_range_vf is not None:
                value = values[mb] + (value - values[mb]).clamp(-clip_range_vf, clip_range_vf)
            loss = -surrogate.mean() + vf_coef * ((returns[mb] - value) ** 2).mean() - ent_coef * entropy.mean()
            optimizer.zero_grad()
            loss.backward()
            grad_norm = th.sqrt(sum((p.grad**2).sum() for p in policy.parameters() if p.grad is not None))
            scale = max_grad_norm / (grad_norm + 1e-6)
            if scale < 1:
                for p in policy.parameters():
                    if p.grad is not None:
                        p.grad *= scale
            optimizer.step()
            if too_far:
                stop_iter = epoch
                break
        if stop_iter is not None:
            return stop_iter + 1, kls
        passes_run = epoch + 1
    return passes_run, kls


@pytest.mark.parametrize(("batch_size", "clip_range_vf"), [(None, None), (10, None), (10, 0.05)])
def test_one_update_changes_parameters_exactly_as_a_reference_ppo_step(
    batch_size: int | None, clip_range_vf: float | None
) -> None:
    hyperparameters: dict[str, Any] = dict(
        learning_rate=3e-3, clip_range=0.2, ent_coef=0.01, vf_coef=0.5, max_grad_norm=0.5, clip_range_vf=clip_range_vf
    )
    policy = make_policy(learning_rate=hyperparameters["learning_rate"])
    reference = copy.deepcopy(policy)
    trajectories = make_trajectories([(9, False), (4, True), (11, False)])
    initial = [p.detach().clone() for p in policy.parameters()]

    batch = build_batch(policy, trajectories, settings())
    update_settings = {name: value for name, value in hyperparameters.items() if name != "learning_rate"}
    stats = ppo_update(policy, batch, settings(n_epochs=3, batch_size=batch_size, target_kl=None, **update_settings))
    reference_ppo_update(reference, trajectories, n_epochs=3, batch_size=batch_size, **hyperparameters)

    assert stats.n_epochs_run == 3
    for (name, p), p_ref, p0 in zip(policy.named_parameters(), reference.parameters(), initial, strict=True):
        assert not th.equal(p, p0), f"{name} did not change"
        assert th.allclose(p, p_ref, rtol=1e-5, atol=1e-6), f"{name} differs from the reference step"


def kl_sequence(trajectories: list[Trajectory], **hyperparameters: Any) -> list[float]:
    """The approximate KL of every minibatch of an update with no early stop."""
    _, kls = reference_ppo_update(make_policy(learning_rate=hyperparameters["learning_rate"]), trajectories, **hyperparameters)
    return kls


@pytest.mark.parametrize("kl_stop", ["after_step", "before_step"])
def test_kl_stop_in_the_middle_of_a_pass_matches_the_reference_step_for_step(kl_stop: str) -> None:
    hyperparameters: dict[str, Any] = dict(
        n_epochs=6, batch_size=8, learning_rate=1e-2, clip_range=0.2, ent_coef=0.0, vf_coef=0.5, max_grad_norm=0.5,
        clip_range_vf=None,
    )
    # 24 transitions: 3 minibatches a pass. With this seed the KL sets a record at the middle minibatch of pass 3.
    trajectories = make_trajectories([(9, False), (4, True), (11, False)], seed=6)
    kls = kl_sequence(trajectories, **hyperparameters)
    crossing = 7
    assert kls[crossing] > max(kls[:crossing]), "the test needs a KL record at its chosen minibatch"
    target_kl = (max(kls[:crossing]) + kls[crossing]) / 2 / 1.5

    policy = make_policy(learning_rate=hyperparameters["learning_rate"])
    reference = copy.deepcopy(policy)
    batch = build_batch(policy, trajectories, settings())
    update_settings = {name: value for name, value in hyperparameters.items() if name != "learning_rate"}
    stats = ppo_update(policy, batch, settings(target_kl=target_kl, kl_stop=kl_stop, **update_settings))
    passes_run, _ = reference_ppo_update(reference, trajectories, target_kl=target_kl, kl_stop=kl_stop, **hyperparameters)

    # Stopped in pass 3, after 2 steps of it (after_step: 8 steps in all) or 1 (before_step: 7 steps).
    assert stats.n_epochs_run == passes_run == 3
    assert adam_steps(policy) == (8 if kl_stop == "after_step" else 7)
    for (name, p), p_ref in zip(policy.named_parameters(), reference.parameters(), strict=True):
        assert th.allclose(p, p_ref, rtol=1e-5, atol=1e-6), f"{name} differs from the reference"


def test_a_kl_stop_at_a_passs_first_minibatch_before_its_step_does_not_count_that_pass() -> None:
    hyperparameters: dict[str, Any] = dict(
        n_epochs=6, batch_size=8, learning_rate=1e-2, clip_range=0.2, ent_coef=0.0, vf_coef=0.5, max_grad_norm=0.5,
        clip_range_vf=None,
    )
    trajectories = make_trajectories([(9, False), (4, True), (11, False)], seed=6)
    kls = kl_sequence(trajectories, **hyperparameters)
    crossing = 9  # the first minibatch of the fourth pass
    assert kls[crossing] > max(kls[:crossing])
    target_kl = (max(kls[:crossing]) + kls[crossing]) / 2 / 1.5
    policy = make_policy(learning_rate=hyperparameters["learning_rate"])
    batch = build_batch(policy, trajectories, settings())

    stats = ppo_update(policy, batch, settings(n_epochs=6, batch_size=8, target_kl=target_kl, kl_stop='before_step'))

    assert stats.n_epochs_run == 3 and adam_steps(policy) == 9


# --- Every action space, and Dict observations -----------------------------------------------------------------------

SPACES = {
    "discrete": (OBS_SPACE, spaces.Discrete(3)),
    "box": (OBS_SPACE, spaces.Box(-1.0, 1.0, (2,), np.float32)),
    "multi_discrete": (OBS_SPACE, spaces.MultiDiscrete([2, 3])),
    "multi_binary": (OBS_SPACE, spaces.MultiBinary(3)),
    "dict_obs": (
        spaces.Dict({"position": spaces.Box(-1.0, 1.0, (3,), np.float32), "mode": spaces.Discrete(4)}),
        spaces.Discrete(3),
    ),
}


@pytest.mark.parametrize("kind", list(SPACES))
def test_every_action_space_and_dict_observations_go_through_the_update(kind: str) -> None:
    observation_space, action_space = SPACES[kind]
    policy = make_policy(observation_space, action_space, learning_rate=1e-3)
    trajectories = sampled_trajectories(policy, [(5, False), (7, True)])
    initial = [p.detach().clone() for p in policy.parameters()]

    batch = build_batch(policy, trajectories, settings())
    stats = ppo_update(policy, batch, settings(n_epochs=2, batch_size=5, target_kl=None))

    # Recomputed log-probs agree with the ones sampled at collection (same weights): the actions round-trip.
    stored_log_probs = th.as_tensor(np.concatenate([t.log_probs for t in trajectories]))
    assert th.allclose(batch.old_log_prob, stored_log_probs, atol=1e-5)
    assert stats.n_epochs_run == 2 and stats.n_transitions == 12 and stats.n_trajectories == 2
    assert np.isfinite([stats.policy_loss, stats.value_loss, stats.approx_kl, stats.entropy_loss]).all()
    assert any(not th.equal(p, p0) for p, p0 in zip(policy.parameters(), initial, strict=True))


# --- Normalized returns ----------------------------------------------------------------------------------------------


def return_normalizer_with(mean: float, var: float, count: float = 1000.0) -> ReturnNormalizer:
    normalizer = ReturnNormalizer()
    rms = normalizer.return_rms
    rms.mean, rms.var, rms.count = np.array(mean), np.array(var), count
    return normalizer


def test_value_head_is_denormalized_before_gae_and_targets_are_normalized() -> None:
    policy = make_policy()
    trajectories = make_trajectories([(5, True), (6, False), (3, True)])
    normalizer = return_normalizer_with(mean=3.0, var=4.0)
    head_values = network_values(policy, np.concatenate([t.observations for t in trajectories]))
    head_bootstrap = fresh_bootstrap_values(policy, trajectories)

    batch = build_batch(policy, trajectories, settings(), return_normalizer=normalizer)

    # The head predicts (return - 3) / 2: on the return scale V = 2 * head + 3. A terminal state is worth 0.
    values = 2.0 * head_values + 3.0
    bootstrap = np.where([t.terminated for t in trajectories], 0.0, 2.0 * head_bootstrap + 3.0)
    expected_advantages, expected_returns = sb3_gae(*gae_inputs(trajectories, values, bootstrap))
    expected_rms = RunningMeanStd(shape=())
    expected_rms.mean, expected_rms.var, expected_rms.count = np.array(3.0), np.array(4.0), 1000.0
    expected_rms.update(expected_returns.astype(np.float64))
    np.testing.assert_allclose(batch.advantages.numpy(), expected_advantages, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(normalizer.return_rms.mean, expected_rms.mean, rtol=1e-6)
    np.testing.assert_allclose(normalizer.return_rms.var, expected_rms.var, rtol=1e-6)
    new_scale = np.sqrt(expected_rms.var)
    np.testing.assert_allclose(
        batch.returns.numpy(), (expected_returns - expected_rms.mean) / new_scale, rtol=1e-5, atol=1e-5
    )
    # One scale: the old values are the values GAE used, normalized with the updated statistics, like the targets.
    np.testing.assert_allclose(batch.old_values.numpy(), (values - expected_rms.mean) / new_scale, rtol=1e-5, atol=1e-5)


def test_explained_variance_measures_the_old_values_against_the_returns_on_one_scale() -> None:
    policy = make_policy()
    trajectories = make_trajectories([(5, True), (6, False), (7, True)])
    normalizer = return_normalizer_with(mean=10.0, var=1.0, count=2.0)  # the batch moves the statistics a lot
    observations = np.concatenate([t.observations for t in trajectories])
    values_on_return_scale = normalizer.denormalize(network_values(policy, observations))
    batch = build_batch(policy, trajectories, settings(), return_normalizer=normalizer)
    returns_on_return_scale = normalizer.denormalize(batch.returns.numpy())

    stats = ppo_update(policy, batch, settings(n_epochs=1, target_kl=None))

    # Explained variance is unchanged by one affine map of both: it is that of the returns by the values GAE used.
    expected = 1 - np.var(returns_on_return_scale - values_on_return_scale) / np.var(returns_on_return_scale)
    assert stats.explained_variance == pytest.approx(expected, rel=1e-4)


def test_return_statistics_persist_across_updates() -> None:
    policy = make_policy()
    normalizer = ReturnNormalizer()
    first = make_trajectories([(5, True), (6, False)], seed=1)
    second = make_trajectories([(4, True)], seed=2)

    build_batch(policy, first, settings(), return_normalizer=normalizer)
    mean_after_first = float(normalizer.return_rms.mean)
    build_batch(policy, second, settings(), return_normalizer=normalizer)

    assert normalizer.return_rms.count == pytest.approx(1e-4 + 11 + 4)
    assert float(normalizer.return_rms.mean) != mean_after_first


def test_return_normalizer_accumulates_like_one_running_mean_std() -> None:
    rng = np.random.default_rng(0)
    first, second = rng.normal(5.0, 2.0, size=50), rng.normal(-1.0, 3.0, size=30)
    normalizer = ReturnNormalizer()

    normalizer.update(first)
    normalizer.update(second)

    expected = RunningMeanStd(shape=())
    expected.update(np.concatenate([first, second]))
    np.testing.assert_allclose(normalizer.return_rms.mean, expected.mean, rtol=1e-9)
    np.testing.assert_allclose(normalizer.return_rms.var, expected.var, rtol=1e-9)


def test_return_normalizer_round_trips_through_pickle() -> None:
    normalizer = ReturnNormalizer()
    normalizer.update(np.random.default_rng(0).normal(5.0, 2.0, size=100))
    returns = np.linspace(-10.0, 10.0, 7, dtype=np.float32)

    restored = pickle.loads(pickle.dumps(normalizer))

    np.testing.assert_array_equal(restored.normalize(returns), normalizer.normalize(returns))
    np.testing.assert_allclose(restored.denormalize(restored.normalize(returns)), returns, rtol=1e-5, atol=1e-5)


# --- Observation normalization ---------------------------------------------------------------------------------------

IMAGE_SPACE = spaces.Box(0, 255, (8, 8, 3), np.uint8)


def test_vector_observations_are_normalized_to_zero_mean_unit_variance() -> None:
    normalizer = ObservationNormalizer(spaces.Box(-np.inf, np.inf, (3,), np.float32))
    observations = np.random.default_rng(0).normal([5.0, -2.0, 0.0], [2.0, 0.5, 10.0], size=(2000, 3)).astype(np.float32)

    normalizer.update(observations)
    normalized = normalizer.normalize(observations)

    assert normalized.dtype == np.float32
    np.testing.assert_allclose(normalized.mean(axis=0), 0.0, atol=1e-3)
    np.testing.assert_allclose(normalized.std(axis=0), 1.0, atol=1e-3)


def test_normalized_observations_are_clipped() -> None:
    normalizer = ObservationNormalizer(spaces.Box(-np.inf, np.inf, (1,), np.float32), clip_obs=5.0)
    normalizer.update(np.random.default_rng(0).normal(size=(1000, 1)))

    assert normalizer.normalize(np.array([[1e6], [-1e6]], dtype=np.float32)).tolist() == [[5.0], [-5.0]]


def test_dict_observations_normalize_vector_entries_and_pass_images_and_discrete_through() -> None:
    vector = spaces.Box(-10.0, 10.0, (2,), np.float32)
    space = spaces.Dict({"vector": vector, "image": IMAGE_SPACE, "mode": spaces.Discrete(3)})
    normalizer = ObservationNormalizer(space)
    space.seed(0)
    observations = stack_obs([space.sample() for _ in range(500)])

    normalizer.update(observations)
    normalized = normalizer.normalize(observations)

    assert isinstance(normalized, dict)
    np.testing.assert_allclose(normalized["vector"].mean(axis=0), 0.0, atol=1e-3)
    np.testing.assert_allclose(normalized["vector"].std(axis=0), 1.0, atol=1e-3)
    np.testing.assert_array_equal(normalized["image"], observations["image"])
    assert normalized["image"].dtype == np.uint8
    np.testing.assert_array_equal(normalized["mode"], observations["mode"])


def test_image_observations_pass_through_unchanged() -> None:
    normalizer = ObservationNormalizer(IMAGE_SPACE)
    images = np.random.default_rng(0).integers(0, 256, size=(4, 8, 8, 3), dtype=np.uint8)

    normalizer.update(images)

    assert normalizer.normalize(images) is images


def test_observation_statistics_are_frozen_unless_updated() -> None:
    normalizer = ObservationNormalizer(spaces.Box(-np.inf, np.inf, (2,), np.float32))
    rng = np.random.default_rng(0)
    normalizer.update(rng.normal(3.0, 2.0, size=(100, 2)))
    assert isinstance(normalizer.obs_rms, RunningMeanStd)
    frozen = (normalizer.obs_rms.mean.copy(), normalizer.obs_rms.var.copy(), normalizer.obs_rms.count)
    probe = np.array([[1.0, -1.0]], dtype=np.float32)
    first = normalizer.normalize(probe)

    for _ in range(10):
        normalizer.normalize(rng.normal(100.0, 1.0, size=(50, 2)).astype(np.float32))

    np.testing.assert_array_equal(normalizer.obs_rms.mean, frozen[0])
    np.testing.assert_array_equal(normalizer.obs_rms.var, frozen[1])
    assert normalizer.obs_rms.count == frozen[2]
    np.testing.assert_array_equal(normalizer.normalize(probe), first)
    normalizer.update(rng.normal(100.0, 1.0, size=(50, 2)))
    assert not np.array_equal(normalizer.normalize(probe), first)


def test_observation_normalizer_round_trips_through_pickle() -> None:
    space = spaces.Dict({"vector": spaces.Box(-10.0, 10.0, (2,), np.float32), "image": IMAGE_SPACE})
    normalizer = ObservationNormalizer(space)
    space.seed(0)
    normalizer.update(stack_obs([space.sample() for _ in range(50)]))
    probe = stack_obs([space.sample() for _ in range(5)])

    restored = pickle.loads(pickle.dumps(normalizer))

    for key, value in normalizer.normalize(probe).items():  # type: ignore[union-attr]
        np.testing.assert_array_equal(restored.normalize(probe)[key], value)  # type: ignore[index]


def test_build_batch_normalizes_observations_and_bootstrap_observations() -> None:
    space = spaces.Box(-np.inf, np.inf, (4,), np.float32)
    policy = make_policy(observation_space=space)
    trajectories = make_trajectories([(5, False), (4, True)], observation_space=spaces.Box(-10.0, 10.0, (4,), np.float32))
    normalizer = ObservationNormalizer(space)
    normalizer.update(np.random.default_rng(0).normal(3.0, 4.0, size=(200, 4)))
    raw = np.concatenate([t.observations for t in trajectories])

    batch = build_batch(policy, trajectories, settings(), preprocess_obs=normalizer.normalize)

    normalized = normalizer.normalize(raw)
    bootstrap = network_values(policy, normalizer.normalize(trajectories[0].bootstrap_obs[None]))  # type: ignore[arg-type]
    expected_advantages, _ = sb3_gae(*gae_inputs(trajectories, network_values(policy, normalized), [bootstrap[0], 0.0]))
    np.testing.assert_array_equal(batch.observations.numpy(), normalized)  # type: ignore[union-attr]
    np.testing.assert_allclose(batch.advantages.numpy(), expected_advantages, rtol=1e-5, atol=1e-5)
