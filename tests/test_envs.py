"""IPPO on many kinds of PettingZoo envs: heterogeneous agents, dying and late agents, continuous actions, images,
Dict observations, AEC envs, one copy and several (dummy and subprocess)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch as th
from gymnasium import spaces
from mpe2 import simple_adversary_v3, simple_spread_v3
from pettingzoo.butterfly import knights_archers_zombies_v11
from pettingzoo.classic import tictactoe_v3
from pettingzoo.sisl import multiwalker_v9

from sb3_ippo import IPPO, make_vec_env
from sb3_ippo.vec_env import to_parallel_env
from tests.envs import DyingAgentsEnv, HeterogeneousEnv, VariableLengthEnv
from tests.helpers import assert_same_parameters, parameters

TINY_CNN = dict(net_arch=[16], features_extractor_kwargs=dict(features_dim=16))


def make_model(env: Any, policy: str = "MlpPolicy", **kwargs: Any) -> IPPO:
    params: dict[str, Any] = dict(n_episodes=2, rollout_len=None, n_epochs=2, policy_kwargs=dict(net_arch=[16]), seed=0)
    params.update(kwargs)
    return IPPO(policy, env, **params)


def changed_agents(before: dict[str, dict[str, th.Tensor]], model: IPPO) -> set[str]:
    """The agents whose parameters differ from ``before``."""
    after = parameters(model)
    return {
        agent for agent, params in after.items() if any(not th.equal(before[agent][name], p) for name, p in params.items())
    }


def assert_actions_in_spaces(model: IPPO, actions: dict[str, Any]) -> None:
    for agent, action in actions.items():
        space = model.action_spaces[agent]
        assert space.contains(np.asarray(action, dtype=space.dtype)), f"agent {agent!r}: {action} not in {space}"


class ChannelFirstImageEnv(HeterogeneousEnv):
    """:class:`HeterogeneousEnv`'s ``"image"`` agent seeing its image channel-first, (3, 36, 36), as SB3's CnnPolicy
    expects: action 1 is paid when the image is bright."""

    def __init__(self, max_steps: int = 4) -> None:
        super().__init__(agents=["image"], max_steps=max_steps)
        self.observation_spaces["image"] = spaces.Box(0, 255, (3, 36, 36), np.uint8)

    def _draw(self, agent: str) -> Any:
        return super()._draw(agent).transpose(2, 0, 1)

    def _reward(self, agent: str, obs: Any, action: Any) -> float:
        return super()._reward(agent, obs.transpose(1, 2, 0), action)


class ActionRecordingEnv(HeterogeneousEnv):
    """A :class:`HeterogeneousEnv` that keeps every action it is given."""

    def __init__(self, agents: list[str]) -> None:
        super().__init__(agents=agents)
        self.received: list[dict[str, Any]] = []

    def step(self, actions: dict[str, Any]) -> tuple[dict, dict, dict, dict, dict]:
        self.received.append(dict(actions))
        return super().step(actions)


# ----------------------------------------------------------------------------------------------------------------
# Heterogeneous agents
# ----------------------------------------------------------------------------------------------------------------


def test_heterogeneous_agents_get_policies_for_their_own_spaces() -> None:
    env = simple_adversary_v3.parallel_env(N=2, max_cycles=5)
    model = make_model(env, n_episodes=1)
    assert model.policies["adversary_0"].observation_space.shape == (8,)
    assert model.policies["agent_0"].observation_space.shape == (10,)
    before = parameters(model)
    model.learn(3 * 5)
    assert model.policy_version == 3
    assert changed_agents(before, model) == {"adversary_0", "agent_0", "agent_1"}


def test_each_action_space_kind_trains_its_own_agent() -> None:
    env = HeterogeneousEnv(agents=["discrete", "box", "multi_discrete", "multi_binary"])
    model = make_model(env)
    for agent in env.possible_agents:
        assert model.policies[agent].action_space == env.action_space(agent)
    before = parameters(model)
    model.learn(2 * 4)
    assert changed_agents(before, model) == set(env.possible_agents)
    observations, _ = env.reset(seed=1)
    assert_actions_in_spaces(model, model.predict(observations)[0])


# ----------------------------------------------------------------------------------------------------------------
# Dying and late agents
# ----------------------------------------------------------------------------------------------------------------


def test_dying_agents_train_on_their_own_shorter_trajectories() -> None:
    model = make_model(DyingAgentsEnv(death_steps={"agent_0": 2, "agent_1": 4, "agent_2": None}, max_steps=6))
    model.learn(2 * 6)
    assert model.policy_version == 1
    assert {agent: stats.n_transitions for agent, stats in model.update_stats.items()} == {
        "agent_0": 2 * 2,
        "agent_1": 2 * 4,
        "agent_2": 2 * 6,
    }


def test_late_agents_train_on_the_steps_they_were_there() -> None:
    # "late" joins after step 2 and acts in steps 3 to 6.
    env = DyingAgentsEnv(death_steps={"early": 5, "late": None}, join_steps={"late": 2}, max_steps=6)
    model = make_model(env)
    model.learn(2 * 6)
    assert model.policy_version == 1
    assert {agent: stats.n_transitions for agent, stats in model.update_stats.items()} == {"early": 2 * 5, "late": 2 * 4}


def test_an_agent_that_never_acts_does_not_hold_back_the_updates() -> None:
    env = DyingAgentsEnv(death_steps={"present": None, "absent": None}, join_steps={"absent": 100}, max_steps=3)
    model = make_model(env)
    before = parameters(model)
    model.learn(2 * 2 * 3)
    assert model.policy_version == 2
    assert changed_agents(before, model) == {"present"}


def test_knights_archers_zombies_agents_that_die_stop_acting() -> None:
    # With line_death, an agent that touches the top or bottom wall dies, as an untrained policy soon does.
    env = knights_archers_zombies_v11.parallel_env(num_archers=1, num_knights=1, max_cycles=300, line_death=True)
    model = make_model(env, n_episodes=1)
    while model.policy_version == 0:
        model.learn(20, reset_num_timesteps=False)
    assert model.ep_info_buffer is not None
    episode_length = model.ep_info_buffer[0]["l"]
    trained_steps = {agent: stats.n_transitions for agent, stats in model.update_stats.items()}
    assert set(trained_steps) == {"archer_0", "knight_0"}
    assert max(trained_steps.values()) == episode_length
    assert min(trained_steps.values()) < episode_length


# ----------------------------------------------------------------------------------------------------------------
# Continuous actions
# ----------------------------------------------------------------------------------------------------------------


def test_continuous_actions_sent_to_the_env_stay_within_bounds() -> None:
    env = ActionRecordingEnv(agents=["box"])
    model = make_model(env)
    model.learn(3 * 4)
    box_actions = np.array([actions["box"] for actions in env.received])
    assert len(box_actions) == 12
    assert np.all(box_actions >= -1.0) and np.all(box_actions <= 1.0)


def test_discrete_actions_with_a_start_reach_the_env_and_predict_within_their_space() -> None:
    env = ActionRecordingEnv(agents=["discrete", "multi_discrete"])
    # SB3's policies pick indices from 0; the env takes start + index (0 is outside MultiDiscrete's first entry).
    env.action_spaces = {
        "discrete": spaces.Discrete(3, start=-1),
        "multi_discrete": spaces.MultiDiscrete([2, 3], start=[5, -2]),
    }
    model = make_model(env)
    model.learn(3 * 4)
    assert model.policy_version > 0
    for agent, space in env.action_spaces.items():
        sent = [actions[agent] for actions in env.received]
        assert all(space.contains(np.asarray(action, dtype=space.dtype)) for action in sent), (agent, sent)
    obs = {"discrete": np.zeros((50, 3), np.float32), "multi_discrete": np.zeros((50, 5), np.float32)}
    predicted, _ = model.predict(obs)
    for agent, space in env.action_spaces.items():
        assert all(space.contains(np.asarray(action, dtype=space.dtype)) for action in predicted[agent]), agent


def test_simple_spread_with_continuous_actions() -> None:
    env = simple_spread_v3.parallel_env(N=2, max_cycles=5, continuous_actions=True)
    model = make_model(env, n_episodes=1)
    assert model.action_spaces["agent_0"] == spaces.Box(0.0, 1.0, (5,), np.float32)
    before = parameters(model)
    model.learn(2 * 5)
    assert changed_agents(before, model) == {"agent_0", "agent_1"}
    observations, _ = env.reset(seed=0)
    assert_actions_in_spaces(model, model.predict(observations)[0])


def test_multiwalker_with_continuous_actions() -> None:
    env = multiwalker_v9.parallel_env(n_walkers=2, max_cycles=20)
    model = make_model(env, n_episodes=1)
    before = parameters(model)
    model.learn(2 * 20)
    assert model.policy_version >= 2
    assert changed_agents(before, model) == {"walker_0", "walker_1"}


# ----------------------------------------------------------------------------------------------------------------
# Image and Dict observations
# ----------------------------------------------------------------------------------------------------------------


def test_cnn_policy_on_channel_first_images() -> None:
    env = ChannelFirstImageEnv()
    model = make_model(env, "CnnPolicy", policy_kwargs=TINY_CNN)
    before = parameters(model)
    model.learn(2 * 4)
    assert changed_agents(before, model) == {"image"}
    observations, _ = env.reset(seed=0)
    assert_actions_in_spaces(model, model.predict(observations, deterministic=True)[0])


def test_cnn_policy_on_channel_last_images() -> None:
    """PettingZoo's (H, W, C) images reach the policy channel-first, in training and in predict."""
    env = HeterogeneousEnv(agents=["image"])
    model = make_model(env, "CnnPolicy", policy_kwargs=TINY_CNN)
    model.learn(2 * 4)
    assert model.policy_version == 1
    image_space = env.observation_space("image")
    assert model.policies["image"].observation_space.shape == (image_space.shape[2], *image_space.shape[:2])
    observations, _ = env.reset(seed=0)
    single, _ = model.predict(observations, deterministic=True)
    batched, _ = model.predict({"image": observations["image"][None]}, deterministic=True)
    assert batched["image"].shape == (1,) and batched["image"][0] == single["image"]


def test_exported_cnn_agent_predicts_the_same_on_channel_last_images(tmp_path: Any) -> None:
    from stable_baselines3 import PPO

    env = HeterogeneousEnv(agents=["image"])
    model = make_model(env, "CnnPolicy", policy_kwargs=TINY_CNN)
    model.learn(2 * 4)
    model.export_agent("image", tmp_path / "image.zip")
    exported = PPO.load(tmp_path / "image.zip")
    observations, _ = env.reset(seed=1)
    batch = np.stack([observations["image"], 255 - observations["image"]])
    expected, _ = model.predict({"image": batch}, deterministic=True)
    actions, _ = exported.predict(batch, deterministic=True)
    np.testing.assert_array_equal(actions, expected["image"])


def test_cnn_policy_on_resized_pistonball() -> None:
    import supersuit
    from pettingzoo.butterfly import pistonball_v6

    env = pistonball_v6.parallel_env(n_pistons=3, max_cycles=10)
    env = supersuit.resize_v1(env, x_size=36, y_size=36)  # RGB, channel-last, as PettingZoo gives it
    model = make_model(env, "CnnPolicy", policy_kwargs=TINY_CNN, n_episodes=1)
    before = parameters(model)
    model.learn(2 * 10)
    assert model.policy_version >= 2
    assert changed_agents(before, model) == {"piston_0", "piston_1", "piston_2"}


def test_multi_input_policy_on_dict_observations() -> None:
    env = HeterogeneousEnv(agents=["dict"])
    model = make_model(env, "MultiInputPolicy")
    before = parameters(model)
    model.learn(2 * 4)
    assert changed_agents(before, model) == {"dict"}
    observations, _ = env.reset(seed=0)
    assert_actions_in_spaces(model, model.predict(observations, deterministic=True)[0])


def test_normalize_obs_on_dict_observations_normalizes_the_vector_entries() -> None:
    model = make_model(HeterogeneousEnv(agents=["dict"]), "MultiInputPolicy", normalize_obs=True)
    model.learn(2 * 4)
    assert model.obs_normalizers is not None
    rms = model.obs_normalizers["dict"].obs_rms
    assert isinstance(rms, dict) and list(rms) == ["features"]
    assert rms["features"].count == pytest.approx(2 * 4, abs=1e-3)


def test_multi_input_policy_for_an_agent_without_dict_observations_names_the_agent() -> None:
    with pytest.raises(ValueError, match=r"'discrete'.*Dict"):
        make_model(HeterogeneousEnv(agents=["dict", "discrete"]), "MultiInputPolicy")


# ----------------------------------------------------------------------------------------------------------------
# AEC envs
# ----------------------------------------------------------------------------------------------------------------


def test_an_aec_env_is_converted_to_parallel() -> None:
    model = make_model(simple_spread_v3.env(N=2, max_cycles=5), n_episodes=1)
    assert model.possible_agents == ["agent_0", "agent_1"]
    model.learn(2 * 5)
    assert model.policy_version == 2


def test_an_aec_env_that_cannot_run_in_parallel_is_stepped_turn_by_turn() -> None:
    # Games: see tests/test_games.py. Only a direct conversion to a parallel env is still refused.
    model = make_model(tictactoe_v3.env())
    assert type(model.env).__name__ == "TurnBasedMultiAgentVecEnv"
    with pytest.raises(ValueError, match=r"tictactoe.*parallel"):
        to_parallel_env(tictactoe_v3.env())


# ----------------------------------------------------------------------------------------------------------------
# One copy and several, in this process and in worker processes
# ----------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("n_envs", "vec_env_cls"), [(1, "dummy"), (3, "dummy"), (2, "subproc")])
def test_learn_on_one_or_several_copies(n_envs: int, vec_env_cls: str) -> None:
    env = make_vec_env(VariableLengthEnv, n_envs=n_envs, seed=0, vec_env_cls=vec_env_cls)
    try:
        model = make_model(env)
        before = parameters(model)
        model.learn(30)
        assert model.num_timesteps == 30 + (-30) % n_envs
        assert model.policy_version >= 1
        assert changed_agents(before, model) == {"agent_0", "agent_1"}
    finally:
        env.close()


def test_subproc_and_dummy_copies_train_the_same_parameters() -> None:
    trained = {}
    for vec_env_cls in ("dummy", "subproc"):
        env = make_vec_env(VariableLengthEnv, n_envs=2, seed=0, vec_env_cls=vec_env_cls)
        try:
            model = make_model(env)
            model.learn(40)
            trained[vec_env_cls] = parameters(model)
        finally:
            env.close()
    assert_same_parameters(trained["dummy"], trained["subproc"])
