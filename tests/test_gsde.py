"""gSDE (``use_sde=True``) explores as in SB3's PPO: every agent's exploration matrices are drawn from its policy's
current standard deviation at the start of every rollout (and every ``sde_sample_freq`` steps), so sampled actions
vary between rollouts, follow the std that PPO trains, and reproduce with a seed; the setting saves, loads and exports."""

from __future__ import annotations

import copy
import pathlib
from collections import defaultdict
from typing import Any

import numpy as np
import pytest
import torch as th
from gymnasium import spaces
from stable_baselines3 import PPO
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.distributions import StateDependentNoiseDistribution

from sb3_ippo import IPPO
from tests.envs import DyingAgentsEnv
from tests.helpers import assert_same_actions, assert_same_parameters, observation_batch, parameters

AGENTS = ["agent_0", "agent_1", "agent_2"]
# DyingAgentsEnv: one copy, 6-step episodes; with n_episodes=2 an update is due every 12 env steps, so every rollout
# is two whole episodes, which show every agent the same observation at the same step.
ROLLOUT_STEPS = 12


def box_env() -> DyingAgentsEnv:
    return DyingAgentsEnv(action_space=spaces.Box(-1.0, 1.0, (2,), np.float32))


def frozen(**kwargs: Any) -> dict[str, Any]:
    """Settings under which updates leave the weights as they are (a learning rate of 0): what changes the sampled
    actions from one rollout to the next is then the exploration noise alone."""
    params: dict[str, Any] = dict(
        n_episodes=2, n_epochs=1, learning_rate=lambda _: 0.0, seed=0, async_training=False, policy_kwargs=dict(net_arch=[16])
    )
    params.update(kwargs)
    return params


class RecordActions(BaseCallback):
    """Every action the model samples in collection: ``{agent: [(rollout, step in rollout, observation, action)]}``."""

    def __init__(self) -> None:
        super().__init__()
        self.rollout = -1
        self.step_in_rollout = 0
        self.actions: dict[str, list[tuple[int, int, bytes, np.ndarray]]] = defaultdict(list)

    def _on_rollout_start(self) -> None:
        self.rollout += 1
        self.step_in_rollout = 0

    def _on_step(self) -> bool:
        obs, alive = self.locals["obs"], self.locals["learning"]
        for agent, (actions, _, _) in self.locals["sampled"].items():
            for row in np.flatnonzero(alive[agent]):
                self.actions[agent].append((self.rollout, self.step_in_rollout, obs[agent][row].tobytes(), actions[row]))
        self.step_in_rollout += 1
        return True

    def second_step_actions(self, agent: str) -> dict[int, list[np.ndarray]]:
        """``{rollout: [the agent's action at the second step of each episode]}``: one observation (see ROLLOUT_STEPS),
        ``[1/6, target]``; at the first step, ``[0, 0]`` makes a fresh network's latent features, and so its noise, 0."""
        first: dict[int, list[np.ndarray]] = defaultdict(list)
        for rollout, step, _, action in self.actions[agent]:
            if step % 6 == 1:
                first[rollout].append(action)
        return first


def distinct(actions: list[np.ndarray]) -> int:
    return len({np.round(action, 6).tobytes() for action in actions})


def test_sampled_actions_vary_between_rollouts_and_stay_within_one() -> None:
    model = IPPO("MlpPolicy", box_env(), **frozen(policy_kwargs=dict(net_arch=[16], use_sde=True)))
    recorder = RecordActions()
    model.learn(10 * ROLLOUT_STEPS, callback=recorder)
    assert model.policy_version == 10
    for agent in AGENTS:
        first = recorder.second_step_actions(agent)
        assert len(first) == 10
        # One matrix per rollout: the same observation gets the same action in both episodes of a rollout...
        assert all(distinct(actions) == 1 for actions in first.values()), agent
        # ... and a new one in every rollout, as SB3's PPO(use_sde=True) draws a new matrix per rollout.
        assert distinct([actions[0] for actions in first.values()]) == 10, agent


def test_sampled_actions_follow_the_policys_current_std() -> None:
    model = IPPO("MlpPolicy", box_env(), **frozen(policy_kwargs=dict(net_arch=[16], use_sde=True)))
    model.learn(ROLLOUT_STEPS)
    for policy in model.policies.values():
        with th.no_grad():
            policy.log_std.fill_(-10.0)  # a std of 4.5e-5: the policy is all but deterministic
    recorder = RecordActions()
    model.learn(ROLLOUT_STEPS, callback=recorder, reset_num_timesteps=False)
    for agent in AGENTS:
        policy = model.policies[agent]
        for _, _, obs, action in recorder.actions[agent]:
            with th.no_grad():
                mean = policy.get_distribution(th.as_tensor(np.frombuffer(obs, np.float32))[None]).mode()[0].numpy()
            np.testing.assert_allclose(action, mean, atol=1e-3)


def test_sde_sample_freq_draws_new_matrices_within_a_rollout() -> None:
    model = IPPO("MlpPolicy", box_env(), **frozen(use_sde=True, sde_sample_freq=2))
    recorder = RecordActions()
    model.learn(3 * ROLLOUT_STEPS, callback=recorder)
    for agent in AGENTS:
        for actions in recorder.second_step_actions(agent).values():
            assert distinct(actions) == 2, f"{agent}: the second episode (from step 6) explores with a new matrix"


def test_members_sharing_a_policy_explore_each_with_its_own_matrix() -> None:
    # agent_0 and agent_2 observe the same thing at the second step of an episode (DyingAgentsEnv's targets).
    model = IPPO("MlpPolicy", box_env(), **frozen(share_parameters=True, policy_kwargs=dict(net_arch=[16], use_sde=True)))
    recorder = RecordActions()
    model.learn(3 * ROLLOUT_STEPS, callback=recorder)
    first_0, first_2 = recorder.second_step_actions("agent_0"), recorder.second_step_actions("agent_2")
    for rollout in first_0:
        assert not np.allclose(first_0[rollout][0], first_2[rollout][0]), "one shared matrix would give equal actions"


def test_seeded_runs_reproduce() -> None:
    def run() -> tuple[dict[str, dict[str, th.Tensor]], list[np.ndarray]]:
        model = IPPO("MlpPolicy", box_env(), **frozen(use_sde=True, sde_sample_freq=3, learning_rate=3e-4, seed=3))
        recorder = RecordActions()
        model.learn(4 * ROLLOUT_STEPS, callback=recorder)
        return parameters(model), [action for agent in AGENTS for *_, action in recorder.actions[agent]]

    (first_parameters, second_step_actions), (second_parameters, second_actions) = run(), run()
    assert_same_parameters(first_parameters, second_parameters)
    np.testing.assert_array_equal(second_step_actions, second_actions)


def test_policy_kwargs_use_sde_is_the_use_sde_hyperparameter() -> None:
    model = IPPO("MlpPolicy", box_env(), **frozen(policy_kwargs=dict(net_arch=[16], use_sde=True)))
    assert model.use_sde is True
    assert model.policy_kwargs == dict(net_arch=[16])
    assert all(isinstance(policy.action_dist, StateDependentNoiseDistribution) for policy in model.policies.values())
    with pytest.raises(ValueError, match=r"use_sde=True and policy_kwargs=dict\(use_sde=False\) contradict"):
        IPPO("MlpPolicy", box_env(), **frozen(use_sde=True, policy_kwargs=dict(use_sde=False)))


def test_use_sde_on_discrete_actions_is_refused_naming_the_agent() -> None:
    with pytest.raises(ValueError, match=r"Agent 'agent_0' has the action space Discrete\(2\): gSDE .* needs continuous"):
        IPPO("MlpPolicy", DyingAgentsEnv(), **frozen(use_sde=True))


def test_a_group_may_use_gsde_alone() -> None:
    model = IPPO(
        "MlpPolicy",
        box_env(),
        **frozen(groups={"explorers": ["agent_0"]}, group_kwargs={"explorers": dict(policy_kwargs=dict(use_sde=True))}),
    )
    assert isinstance(model.policies["agent_0"].action_dist, StateDependentNoiseDistribution)
    assert not model.policies["agent_1"].use_sde
    recorder = RecordActions()
    model.learn(4 * ROLLOUT_STEPS, callback=recorder)
    assert distinct([actions[0] for actions in recorder.second_step_actions("agent_0").values()]) == 4


@pytest.mark.parametrize("suffix", [".zip", ".safetensors"])
def test_save_and_load_keep_gsde(tmp_path: pathlib.Path, suffix: str) -> None:
    model = IPPO("MlpPolicy", box_env(), **frozen(use_sde=True, sde_sample_freq=4, learning_rate=3e-4))
    model.learn(2 * ROLLOUT_STEPS)
    model.save(tmp_path / f"model{suffix}")
    loaded = IPPO.load(tmp_path / f"model{suffix}", env=box_env())
    assert (loaded.use_sde, loaded.sde_sample_freq) == (True, 4)
    assert all(isinstance(policy.action_dist, StateDependentNoiseDistribution) for policy in loaded.policies.values())
    obs = observation_batch(model)
    assert_same_actions(loaded.predict(obs, deterministic=True)[0], model.predict(obs, deterministic=True)[0])
    recorder = RecordActions()
    loaded.learn(2 * ROLLOUT_STEPS, callback=recorder, reset_num_timesteps=False)
    assert loaded.policy_version == 4
    assert distinct([actions[0] for actions in recorder.second_step_actions("agent_2").values()]) == 2


def test_a_gsde_policy_deep_copies_and_the_learner_process_trains_it() -> None:
    model = IPPO("MlpPolicy", box_env(), **frozen(policy_kwargs=dict(use_sde=True), learning_rate=3e-4, async_training=True))
    copy.deepcopy(model.policies["agent_0"])  # as self-play snapshots copy policies
    model.learn(3 * ROLLOUT_STEPS)
    assert model.policy_version >= 2


def test_export_agent_of_a_gsde_agent_is_a_gsde_ppo_with_the_same_actions(tmp_path: pathlib.Path) -> None:
    model = IPPO("MlpPolicy", box_env(), **frozen(policy_kwargs=dict(net_arch=[16], use_sde=True), learning_rate=3e-4))
    model.learn(2 * ROLLOUT_STEPS)
    model.export_agent("agent_1", tmp_path / "agent_1.zip")
    ppo = PPO.load(tmp_path / "agent_1.zip")
    assert ppo.use_sde and isinstance(ppo.policy.action_dist, StateDependentNoiseDistribution)
    obs = np.random.default_rng(0).uniform(0.0, 1.0, (16, 2)).astype(np.float32)
    np.testing.assert_array_equal(
        ppo.predict(obs, deterministic=True)[0], model.predict({"agent_1": obs}, deterministic=True)[0]["agent_1"]
    )


def test_a_recurrent_gsde_policy_draws_new_matrices_per_rollout() -> None:
    model = IPPO("MlpLstmPolicy", box_env(), **frozen(policy_kwargs=dict(net_arch=[16], lstm_hidden_size=8, use_sde=True)))
    recorder = RecordActions()
    model.learn(4 * ROLLOUT_STEPS, callback=recorder)
    assert distinct([actions[0] for actions in recorder.second_step_actions("agent_2").values()]) == 4
