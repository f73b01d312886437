"""MAPPO: per-agent actors on their own observations, a centralized critic on the state or the joint observation."""

from __future__ import annotations

import pathlib
from typing import Any

import numpy as np
import pytest
import torch as th
from gymnasium import spaces
from mpe2 import simple_spread_v3
from stable_baselines3 import PPO

from sb3_ippo import MAPPO, evaluate_policy, make_vec_env
from sb3_ippo.common.critic_input import CriticInput, CriticInputWrapper
from sb3_ippo.vec_env import MultiAgentVecEnv
from tests.envs import DyingAgentsEnv, HeterogeneousEnv
from tests.helpers import assert_same_actions, record_trajectories, stacked_groups

AGENTS = ["agent_0", "agent_1", "agent_2"]
OBS_SIZE = 18  # simple_spread N=3: each agent's observation; its state is the three observations end to end


def spread(max_cycles: int = 5) -> Any:
    return simple_spread_v3.parallel_env(N=3, max_cycles=max_cycles)


def make_mappo(env: Any = None, **kwargs: Any) -> MAPPO:
    params: dict[str, Any] = dict(n_episodes=2, n_epochs=2, policy_kwargs=dict(net_arch=[16]), seed=0, async_training=False)
    params.update(kwargs)
    return MAPPO("MlpPolicy", env if env is not None else spread(), **params)


def own_obs_batch(n: int = 8, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {agent: rng.normal(size=(n, OBS_SIZE)).astype(np.float32) for agent in AGENTS}


def spread_observations(agent: str, n_steps: int = 20) -> np.ndarray:
    """``agent``'s observations along a random-action episode of simple_spread."""
    env = spread(max_cycles=n_steps)
    obs, _ = env.reset(seed=7)
    seen = []
    while env.agents:
        seen.append(obs[agent])
        obs, *_ = env.step({a: env.action_space(a).sample() for a in env.agents})
    return np.stack(seen)


def policy_outputs(model: MAPPO, agent: str, own: np.ndarray, critic: np.ndarray) -> tuple[th.Tensor, th.Tensor]:
    """The action distribution's parameters and the values of ``agent``'s policy for these inputs."""
    policy = model.policies[agent]
    obs = {"obs": th.as_tensor(own), "critic": th.as_tensor(critic)}
    with th.no_grad():
        distribution = policy.get_distribution(obs)
        return distribution.distribution.logits, policy.predict_values(obs).flatten()


@pytest.fixture(scope="module")
def trained() -> MAPPO:
    model = make_mappo(critic_input="state")
    model.learn(100)
    assert model.policy_version >= 1
    return model


# --- What the actor and the critic see ---------------------------------------------------------------------------------


def test_the_actor_ignores_the_critic_input_and_the_critic_uses_it(trained: MAPPO) -> None:
    rng = np.random.default_rng(1)
    own = own_obs_batch()["agent_0"]
    critic_size = trained.observation_spaces["agent_0"]["critic"].shape[0]  # type: ignore[index]
    first, second = (rng.normal(size=(len(own), critic_size)).astype(np.float32) for _ in range(2))
    logits_a, values_a = policy_outputs(trained, "agent_0", own, first)
    logits_b, values_b = policy_outputs(trained, "agent_0", own, second)
    th.testing.assert_close(logits_a, logits_b, rtol=0, atol=0)
    assert not th.allclose(values_a, values_b), "the critic reads the critic input"


def test_the_critic_ignores_the_own_observation_and_the_actor_uses_it(trained: MAPPO) -> None:
    critic = np.random.default_rng(2).normal(size=(8, 3 * OBS_SIZE)).astype(np.float32)
    logits_a, values_a = policy_outputs(trained, "agent_1", own_obs_batch(seed=3)["agent_1"], critic)
    logits_b, values_b = policy_outputs(trained, "agent_1", own_obs_batch(seed=4)["agent_1"], critic)
    th.testing.assert_close(values_a, values_b, rtol=0, atol=0)
    assert not th.allclose(logits_a, logits_b), "the actor reads the own observation"


def test_state_critic_input_is_the_envs_state_beside_the_own_observation() -> None:
    env = CriticInputWrapper(spread(), "state")
    obs, _ = env.reset(seed=0)
    for _ in range(3):
        state = env.state()
        for agent in AGENTS:
            np.testing.assert_array_equal(obs[agent]["critic"], state)
            np.testing.assert_array_equal(obs[agent]["obs"], state[AGENTS.index(agent) * OBS_SIZE :][:OBS_SIZE])
        obs, *_ = env.step({agent: env.action_space(agent).sample() for agent in env.agents})


def test_agent_specific_critic_input_adds_the_own_observation_and_a_one_hot_id() -> None:
    env = CriticInputWrapper(spread(), CriticInput("state", own_obs=True, agent_id=True))
    obs, _ = env.reset(seed=0)
    critic = obs["agent_1"]["critic"]
    assert critic.shape == (3 * OBS_SIZE + OBS_SIZE + 3,)
    np.testing.assert_array_equal(critic[3 * OBS_SIZE : 4 * OBS_SIZE], obs["agent_1"]["obs"])
    np.testing.assert_array_equal(critic[-3:], [0, 1, 0])
    assert env.observation_space("agent_1")["critic"].shape == critic.shape


def test_joint_obs_of_dying_agents_has_a_zero_slot_and_alive_flag_0() -> None:
    # DyingAgentsEnv: agent_0 leaves after step 2, agent_1 after step 4; observations are 2 numbers each.
    env = CriticInputWrapper(DyingAgentsEnv(), "joint_obs")
    obs, _ = env.reset(seed=0)
    for step in range(1, 7):
        for agent_obs in obs.values():
            critic = agent_obs["critic"]
            assert critic.shape == (3 * 2 + 3,)
            for index, other in enumerate(AGENTS):
                slot, flag = critic[2 * index : 2 * index + 2], critic[6 + index]
                if other in obs:
                    np.testing.assert_array_equal(slot, obs[other]["obs"])
                    assert flag == 1.0
                else:
                    np.testing.assert_array_equal(slot, [0.0, 0.0])
                    assert flag == 0.0, f"step {step}: {other} left"
        obs, *_ = env.step({agent: 0 for agent in env.agents})
    assert not env.agents


def test_mappo_trains_on_dying_agents_with_joint_obs() -> None:
    model = make_mappo(make_vec_env(DyingAgentsEnv, n_envs=2, seed=0, critic_input="joint_obs"), critic_input="joint_obs")
    trajectories = record_trajectories(model)
    model.learn(60)
    assert model.policy_version >= 2
    flags = np.concatenate([t.observations["critic"][:, 6:] for t in trajectories])  # type: ignore[index]
    assert set(np.unique(flags)) == {0.0, 1.0}, "absent agents are flagged in the stored joint observations"


def test_a_truncated_trajectory_bootstraps_from_the_critic_input_of_its_last_step() -> None:
    model = make_mappo(critic_input="state")
    trajectories = record_trajectories(model)
    model.learn(40)
    truncated = [t for t in trajectories if t.truncated]
    assert truncated
    for trajectory in truncated:
        bootstrap = trajectory.bootstrap_obs
        # The state of simple_spread holds every agent's observation: the bootstrap's own observation is among them.
        slots = bootstrap["critic"].reshape(3, OBS_SIZE)
        assert any(np.array_equal(slot, bootstrap["obs"]) for slot in slots)
        assert not any(np.array_equal(slot, trajectory.observations["obs"][0]) for slot in slots)  # type: ignore[index]


def test_state_on_an_env_without_state_names_joint_obs() -> None:
    with pytest.raises(ValueError, match="critic_input='joint_obs'"):
        make_mappo(DyingAgentsEnv(), critic_input="state")


def image_state_spread() -> Any:
    """simple_spread with a state the size of butterfly's frames (pistonball: 560x880x3)."""
    env = spread()
    env.state_space = spaces.Box(0, 255, (560, 880, 3), np.uint8)
    return env


def test_a_critic_input_too_large_for_an_mlp_is_refused_before_any_network_is_built() -> None:
    with pytest.raises(ValueError, match=r"critic input would be 1,478,400 values .*\(560, 880, 3\).* Use IPPO"):
        make_mappo(image_state_spread(), critic_input="state")


def test_a_vec_env_made_without_the_critic_input_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match=r"make_vec_env\(env_fn, n_envs, critic_input="):
        make_mappo(make_vec_env(spread, n_envs=2), critic_input="state")


def test_an_unknown_critic_input_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="critic_input must be one of"):
        make_mappo(critic_input="global")


def test_normalize_obs_covers_the_critic_input() -> None:
    model = make_mappo(normalize_obs=True)
    model.learn(40)
    rms = model.obs_normalizers["agent_0"].obs_rms  # type: ignore[index]
    assert set(rms) == {"obs", "critic"} and rms["critic"].count > 1 and rms["critic"].mean.shape == (3 * OBS_SIZE,)


# --- Batched groups and the learner process equal the reference --------------------------------------------------------


def trained_parameters(timesteps: int = 60, **kwargs: Any) -> tuple[int, dict[str, dict[str, th.Tensor]]]:
    """The policy version and parameters after ``learn(timesteps)`` on two copies of simple_spread (5 steps an episode)."""
    model = make_mappo(make_vec_env(spread, n_envs=2, seed=0, critic_input="joint_obs"), critic_input="joint_obs", **kwargs)
    model.learn(timesteps)
    params = {
        agent: {name: p.detach().clone() for name, p in policy.named_parameters()} for agent, policy in model.policies.items()
    }
    return model.policy_version, params


def assert_close_parameters(first: dict[str, dict[str, th.Tensor]], second: dict[str, dict[str, th.Tensor]]) -> None:
    assert first.keys() == second.keys()
    for agent, params in first.items():
        for name, p in params.items():
            q = second[agent][name]
            assert th.allclose(q, p, rtol=1e-5, atol=1e-5), f"agent {agent!r}, {name}: max diff {(q - p).abs().max()}"


def test_batched_groups_give_the_reference_parameters() -> None:
    reference_version, reference = trained_parameters(batched=False)
    version, batched = trained_parameters(batched=True)
    assert stacked_groups(make_mappo(batched=True)) == {"agent"}, "the agents' networks are stacked"
    assert version == reference_version >= 3
    assert_close_parameters(batched, reference)


def test_the_learner_process_gives_the_synchronous_first_update() -> None:
    # One update's data (2 episodes on each of 2 copies): learn submits it to the learner and applies it at its end.
    sync_version, sync = trained_parameters(timesteps=10, async_training=False)
    async_version, learner = trained_parameters(timesteps=10, async_training=True)
    assert sync_version == async_version == 1
    assert_close_parameters(learner, sync)


# --- Acting, save/load, export -----------------------------------------------------------------------------------------


def test_predict_takes_the_envs_own_observations(trained: MAPPO) -> None:
    obs, _ = spread().reset(seed=0)
    actions, state = trained.predict(obs, deterministic=True)
    assert state is None and set(actions) == set(AGENTS)
    batched, _ = trained.predict(own_obs_batch(), deterministic=True)
    assert all(np.shape(action) == (8,) for action in batched.values())


def test_predict_of_a_wrong_shape_names_the_own_observation_space(trained: MAPPO) -> None:
    with pytest.raises(ValueError, match=r"agent_0.*expected shape \(18,\)"):
        trained.predict({"agent_0": np.zeros(5, np.float32)})


def test_evaluate_policy_runs_on_the_plain_env(trained: MAPPO) -> None:
    mean, _ = evaluate_policy(trained, spread(), n_eval_episodes=2)
    assert np.isfinite(mean)


@pytest.mark.parametrize("suffix", [".zip", ".safetensors"])
def test_save_and_load_round_trip(tmp_path: pathlib.Path, suffix: str) -> None:
    model = make_mappo(critic_input="joint_obs", critic_own_obs=True, critic_agent_id=True, normalize_obs=True)
    model.learn(60)
    path = tmp_path / f"mappo{suffix}"
    model.save(path)
    loaded = MAPPO.load(path, env=spread())
    assert loaded.critic_input_spec == CriticInput("joint_obs", own_obs=True, agent_id=True)
    assert loaded.policy_version == model.policy_version
    obs = own_obs_batch()
    assert_same_actions(loaded.predict(obs, deterministic=True)[0], model.predict(obs, deterministic=True)[0])
    for agent, policy in model.policies.items():
        for name, tensor in policy.state_dict().items():
            th.testing.assert_close(loaded.policies[agent].state_dict()[name], tensor)
    loaded.learn(30, reset_num_timesteps=False)
    assert loaded.policy_version > model.policy_version


def test_load_without_env_predicts(tmp_path: pathlib.Path, trained: MAPPO) -> None:
    trained.save(tmp_path / "mappo.zip")
    loaded = MAPPO.load(tmp_path / "mappo.zip")
    obs = own_obs_batch()
    assert_same_actions(loaded.predict(obs, deterministic=True)[0], trained.predict(obs, deterministic=True)[0])


@pytest.mark.parametrize("normalize_obs", [False, True])
def test_export_agent_writes_the_actor_as_a_ppo_on_the_own_observation(tmp_path: pathlib.Path, normalize_obs: bool) -> None:
    model = make_mappo(normalize_obs=normalize_obs)
    model.learn(60)
    model.export_agent("agent_2", tmp_path / "agent_2.zip")
    ppo = PPO.load(tmp_path / "agent_2.zip")
    assert ppo.observation_space == spaces.Box(-np.inf, np.inf, (OBS_SIZE,), np.float32)
    obs = spread_observations("agent_2")  # within the clip of normalize_obs (10 standard deviations), as in training
    exported, _ = ppo.predict(obs, deterministic=True)
    np.testing.assert_array_equal(exported, model.predict({"agent_2": obs}, deterministic=True)[0]["agent_2"])
    with th.no_grad():
        values = ppo.policy.predict_values(th.as_tensor(obs))
    assert th.all(values == 0), "the centralized critic is not exported: the exported value head outputs 0"


def test_subproc_copies_compute_the_critic_input() -> None:
    env = make_vec_env(spread, n_envs=2, seed=0, vec_env_cls="subproc", critic_input="state")
    try:
        assert isinstance(env, MultiAgentVecEnv)
        model = make_mappo(env, critic_input="state")
        model.learn(40)
        assert model.policy_version >= 1
    finally:
        env.close()


def test_a_policy_that_is_not_a_central_critic_policy_is_refused() -> None:
    from stable_baselines3.common.policies import ActorCriticPolicy

    with pytest.raises(TypeError, match="CentralCriticPolicy"):
        MAPPO(ActorCriticPolicy, spread())


def test_shared_parameters_share_one_critic_that_knows_whose_value_it_predicts() -> None:
    model = make_mappo(share_parameters=True, critic_input="state", critic_agent_id=True)
    assert model.policies["agent_0"] is model.policies["agent_2"]
    model.learn(60)
    assert model.policy_version >= 2
    critic = np.zeros((1, 3 * OBS_SIZE + 3), np.float32)
    values = []
    for index in range(3):  # the same state, another agent's one-hot: another value
        critic[0, -3:] = np.eye(3)[index]
        values.append(policy_outputs(model, "agent_0", own_obs_batch(n=1)["agent_0"], critic.copy())[1].item())
    assert len(set(values)) == 3


# --- Agents that observe images -----------------------------------------------------------------------------------------

# HeterogeneousEnv's "image" agent observes 36x36x3 uint8 images (all 0 or all 255), "discrete" a vector of 3.
IMAGE_SHAPE = (36, 36, 3)
IMAGE_SIZE = 36 * 36 * 3


def image_env() -> HeterogeneousEnv:
    return HeterogeneousEnv(agents=["image", "discrete"])


def random_images(n: int = 64, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (n, *IMAGE_SHAPE), dtype=np.uint8)


def make_actor_see_the_image(policy: Any) -> None:
    """Actor weights under which the deterministic action depends on the image's pixels, each in its place (a fresh
    actor's actions on random images are all the same: its layers' output is dominated by the mean pixel)."""
    generator = th.Generator().manual_seed(0)
    first = policy.mlp_extractor.policy_net[0]
    with th.no_grad():
        first.weight.copy_(th.randn(first.weight.shape, generator=generator) * 0.05)
        first.weight -= first.weight.mean(dim=1, keepdim=True)
        first.bias.zero_()
        policy.action_net.weight.copy_(th.randn(policy.action_net.weight.shape, generator=generator))
        policy.action_net.bias.zero_()


@pytest.mark.parametrize("normalize_obs", [False, True])
def test_an_image_observing_agent_exports_with_the_models_actions(tmp_path: pathlib.Path, normalize_obs: bool) -> None:
    model = make_mappo(image_env(), critic_input="joint_obs", normalize_obs=normalize_obs)
    model.learn(16)
    make_actor_see_the_image(model.policies["image"])
    model.export_agent("image", tmp_path / "image.zip")
    ppo = PPO.load(tmp_path / "image.zip")
    images = random_images()
    expected = model.predict({"image": images}, deterministic=True)[0]["image"]
    assert 0 < expected.mean() < 1, "the test's images must get both actions"
    np.testing.assert_array_equal(ppo.predict(images, deterministic=True)[0], expected)


def test_the_critic_sees_images_scaled_as_the_actor_sees_them() -> None:
    env = CriticInputWrapper(image_env(), CriticInput("joint_obs", own_obs=True))
    obs, _ = env.reset(seed=0)
    while not obs["image"]["obs"].any():  # a bright image (all 255), where the scale shows
        obs, *_ = env.step({agent: 0 for agent in env.agents})
    image = obs["image"]["obs"]
    actor_sees = image.reshape(-1).astype(np.float32) / 255.0  # SB3's preprocess_obs, in channel-last order
    for agent in ("image", "discrete"):
        np.testing.assert_allclose(obs[agent]["critic"][:IMAGE_SIZE], actor_sees, rtol=1e-6)
    np.testing.assert_allclose(obs["image"]["critic"][-IMAGE_SIZE:], actor_sees, rtol=1e-6)  # own_obs
    np.testing.assert_array_equal(obs["discrete"]["critic"][-3:], obs["discrete"]["obs"])  # vectors stay as they are
