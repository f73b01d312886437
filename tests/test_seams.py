"""Promises that the seams between the parts of IPPO must keep: saving and loading a shared group, the batched path
against the one-agent-at-a-time reference, callbacks writing weights, the KL stop, the random opponent.

Each test is the regression test of one bug; they were written, and seen failing, before the fixes.
"""

from __future__ import annotations

import copy
import pathlib
from typing import Any

import numpy as np
import pytest
import torch as th
from gymnasium import spaces
from stable_baselines3.common.callbacks import BaseCallback

from sb3_ippo import IPPO, make_vec_env
from sb3_ippo.update.batch import build_batch
from sb3_ippo.update.ppo import ppo_update
from sb3_ippo.games.self_play import RandomOpponent
from sb3_ippo.update.stacked import StackedPolicies
from sb3_ippo.update.stacked_update import stacked_build_batch, stacked_ppo_update
from tests.envs import DyingAgentsEnv
from tests.helpers import EPISODE_LENGTH, TRAJECTORY_LENGTHS, make_policies, sampled_trajectories, settings, stacked_groups

TRANSITIONS_PER_EPISODE = sum(TRAJECTORY_LENGTHS.values())


def make_model(env: Any = None, **kwargs: Any) -> IPPO:
    params: dict[str, Any] = dict(n_episodes=2, n_epochs=2, policy_kwargs=dict(net_arch=[16]), seed=0)
    params.update(kwargs)
    return IPPO("MlpPolicy", env if env is not None else DyingAgentsEnv(), **params)


# --- 1. A shared group keeps one normalizer of each kind through a safe save and load ---------------------------


@pytest.mark.parametrize(("suffix", "trusted"), [("zip", True), ("zip", False), ("safetensors", True)])
def test_a_shared_group_keeps_one_normalizer_of_each_kind_through_save_and_load(
    tmp_path: pathlib.Path, suffix: str, trusted: bool
) -> None:
    model = make_model(share_parameters=True, normalize_obs=True)
    model.learn(2 * EPISODE_LENGTH)
    model.save(tmp_path / f"model.{suffix}")

    loaded = IPPO.load(tmp_path / f"model.{suffix}", env=DyingAgentsEnv(), trusted=trusted)
    obs_count = loaded.obs_normalizers["agent_0"].obs_rms.count  # type: ignore[index, union-attr]
    return_count = loaded.return_normalizers["agent_0"].return_rms.count  # type: ignore[index]
    loaded.learn(2 * EPISODE_LENGTH, reset_num_timesteps=False)

    members = list(loaded.groups["agent"])
    obs_normalizers = {id(loaded.obs_normalizers[agent]) for agent in members}  # type: ignore[index]
    return_normalizers = {id(loaded.return_normalizers[agent]) for agent in members}  # type: ignore[index]
    assert len(obs_normalizers) == 1, f"the {len(members)} members have {len(obs_normalizers)} observation normalizers"
    assert len(return_normalizers) == 1, f"the {len(members)} members have {len(return_normalizers)} return normalizers"
    # Every member's observations and returns of the two further episodes reached the one set of statistics.
    new_transitions = 2 * TRANSITIONS_PER_EPISODE
    for agent in members:
        assert loaded.obs_normalizers[agent].obs_rms.count == pytest.approx(obs_count + new_transitions)  # type: ignore[index, union-attr]
        assert loaded.return_normalizers[agent].return_rms.count == pytest.approx(return_count + new_transitions)  # type: ignore[index]


# --- 2. Frozen parameters stay frozen on both paths ----------------------------------------------------------------


@pytest.mark.parametrize("batched", [True, False])
def test_learn_leaves_parameters_that_do_not_require_grad_alone(batched: bool) -> None:
    model = make_model(batched=batched, learning_rate=1e-2)
    for policy in model.policies.values():
        policy.value_net.requires_grad_(False)
    frozen = {agent: copy.deepcopy(policy.value_net.state_dict()) for agent, policy in model.policies.items()}
    trainable = {agent: policy.action_net.weight.detach().clone() for agent, policy in model.policies.items()}

    model.learn(2 * EPISODE_LENGTH)

    assert model.policy_version == 1
    for agent, policy in model.policies.items():
        for name, value in policy.value_net.state_dict().items():
            assert th.equal(value, frozen[agent][name]), f"agent {agent!r}: frozen value_net.{name} changed"
        assert not th.equal(policy.action_net.weight, trainable[agent])  # the update did run


# --- 3. Acting uses the weights as they are, however they were written ------------------------------------------


class AlwaysActionOne(BaseCallback):
    """At the first step, writes weights that make every policy choose action 1 (through ``.data``, as
    ``vector_to_parameters`` and hand-written weight surgery do); then records the actions the env receives."""

    def __init__(self) -> None:
        super().__init__()
        self.actions_after_write: list[dict[str, np.ndarray]] = []

    def _on_step(self) -> bool:
        if self.n_calls == 1:
            for policy in self.model.policies.values():
                policy.action_net.weight.data.zero_()
                policy.action_net.bias.data.copy_(th.tensor([0.0, 50.0]))
        elif self.model.policy_version == 0:
            self.actions_after_write.append(dict(self.locals["env_actions"]))
        return True


def test_acting_uses_weights_written_through_data_during_learn() -> None:
    model = make_model(batched=True, n_episodes=4)
    assert len(model.groups["agent"]) >= 2
    callback = AlwaysActionOne()

    model.learn(4 * EPISODE_LENGTH, callback=callback)

    assert callback.actions_after_write, "no step ran between the write and the first update"
    for step, actions in enumerate(callback.actions_after_write, start=2):
        for agent, action in actions.items():
            assert np.all(action == 1), f"step {step}, agent {agent!r} played {action}, not 1"


# --- 4. A member the KL stop skips takes no step, even when its gradient is not finite --------------------------


def test_a_member_stopped_before_its_step_keeps_its_parameters_and_adam_state_even_with_a_non_finite_gradient() -> None:
    policies = make_policies(2, spaces.Discrete(3), learning_rate=1e-3)
    trajectories = [sampled_trajectories(policy, [(5, False), (7, True)], seed=i) for i, policy in enumerate(policies)]
    # Member 1's data has log-probs far below its policy's: the ratio overflows to inf, the KL stops the member before
    # its first step, and its loss's gradient is not finite.
    for trajectory in trajectories[1]:
        trajectory.log_probs = np.full_like(trajectory.log_probs, -200.0)
    update_settings = settings(n_epochs=4, batch_size=4, target_kl=0.01, kl_stop="before_step", recompute_log_prob=False)
    initial = [copy.deepcopy(policy.state_dict()) for policy in policies]

    reference = copy.deepcopy(policies)
    reference_stats = [
        ppo_update(policy, build_batch(policy, member, update_settings), update_settings)
        for policy, member in zip(reference, trajectories, strict=True)
    ]
    stacked = StackedPolicies(policies)
    batch = stacked_build_batch(stacked, trajectories, update_settings)
    stats = stacked_ppo_update(stacked, batch, update_settings)

    assert reference_stats[1].n_epochs_run == stats[1].n_epochs_run == 0
    assert reference_stats[0].n_epochs_run > 0  # the other member trains
    for name, value in policies[1].state_dict().items():
        assert th.isfinite(value).all(), f"stopped member's {name} is not finite"
        assert th.equal(value, initial[1][name]), f"stopped member's {name} changed"
    assert policies[1].optimizer.state_dict()["state"] == reference[1].optimizer.state_dict()["state"] == {}


# --- 5. The random opponent plays moves of the action space --------------------------------------------------------


@pytest.mark.parametrize("masked", [False, True])
def test_the_random_opponent_plays_moves_of_a_multi_discrete_space_with_a_start(masked: bool) -> None:
    space = spaces.MultiDiscrete([3, 4], start=[1, -2])
    opponent = RandomOpponent({"player": space}, seed=0)
    features = np.zeros((50, 2), dtype=np.float32)
    obs: Any = {"observation": features, "action_mask": np.ones((50, 3 + 4), dtype=np.int8)} if masked else features

    moves = opponent.act("player", obs)

    assert len(moves) == 50
    for move in moves:
        assert space.contains(move), f"{move} is not in {space}"


# --- 6. batched=True gives the parameters of batched=False: agents that die mid-episode, continuous actions -------


ALL_LIVE = {"agent_0": None, "agent_1": None, "agent_2": None}


def trained_parameters(batched: bool, n_envs: int, env_kwargs: dict[str, Any]) -> dict[str, dict[str, th.Tensor]]:
    env = make_vec_env(DyingAgentsEnv, n_envs=n_envs, seed=0, env_kwargs=env_kwargs)
    model = make_model(env, batched=batched, n_epochs=4, batch_size=4, learning_rate=1e-2)
    assert ("agent" in stacked_groups(model)) == batched  # the two paths are the two paths
    # Six updates or so: the two paths differ by float rounding (batched matrix products against one layer at a time),
    # which training amplifies (about 1e-6 after 6 updates here, 1e-3 after 40): past that, nothing equal is left.
    model.learn(12 * EPISODE_LENGTH)
    assert model.policy_version >= 5
    return {agent: dict(policy.named_parameters()) for agent, policy in model.policies.items()}


@pytest.mark.parametrize(
    ("n_envs", "env_kwargs"),
    [
        (1, {}),
        (1, dict(action_space=spaces.Box(0.0, 1.0, (1,), np.float32))),
        # At 67de84d this one differs even with no deaths: the stacked path draws MultiDiscrete actions in another order.
        (1, dict(action_space=spaces.MultiDiscrete([2, 3]))),
        # No deaths, but enough copies and dimensions that one combined normal sample differs from one per agent.
        (4, dict(action_space=spaces.Box(0.0, 1.0, (3,), np.float32), death_steps=ALL_LIVE)),
    ],
    ids=["discrete", "box", "multi_discrete", "box_4_copies_all_live"],
)
def test_learn_gives_the_same_parameters_batched_and_one_agent_at_a_time(n_envs: int, env_kwargs: dict[str, Any]) -> None:
    batched = trained_parameters(True, n_envs, env_kwargs)
    reference = trained_parameters(False, n_envs, env_kwargs)

    for agent, params in reference.items():
        for name, p in params.items():
            q = batched[agent][name]
            assert th.allclose(q, p, rtol=1e-5, atol=1e-5), f"agent {agent!r}, {name}: max diff {(q - p).abs().max()}"
