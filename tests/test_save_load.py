"""Save, load and export: one zip restores every piece of an IPPO model (mirrors SB3's test_save_load.py)."""

from __future__ import annotations

import io
import pathlib
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch as th
from gymnasium import spaces
from stable_baselines3 import PPO

from sb3_ippo import IPPO
from tests.envs import DyingAgentsEnv, HeterogeneousEnv
from tests.helpers import (
    ALGORITHMS,
    assert_same_actions,
    assert_same_optimizer_state,
    assert_same_parameters,
    make_algo_vec_env,
    make_model,
    observation_batch,
)


@pytest.fixture(scope="module", params=ALGORITHMS, ids=lambda algo: algo.__name__)
def saved(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[IPPO, pathlib.Path]:
    """A model trained with every kind of state (normalizations, stale episodes), and the zip it was saved to.

    Three copies whose agents finish together leave one trajectory per agent after each update; with
    ``max_version_lag=0`` it is stale at the next one, so ``stale_episodes_dropped`` is not 0.
    """
    env = make_algo_vec_env(request.param, DyingAgentsEnv, n_envs=3, seed=0)
    model = make_model(
        env, request.param, normalize_obs=True, normalize_returns=True, max_version_lag=0, time_limit_bootstrap=False
    )
    model.learn(72)
    assert model.policy_version >= 2 and model.stale_episodes_dropped > 0
    path = tmp_path_factory.mktemp("saved") / "ippo.zip"
    model.save(path)
    return model, path


def test_load_restores_each_agents_weights(saved: tuple[IPPO, pathlib.Path]) -> None:
    model, path = saved
    loaded = type(model).load(path)
    assert list(loaded.policies) == model.possible_agents
    for agent, policy in model.policies.items():
        restored = loaded.policies[agent].state_dict()
        for name, tensor in policy.state_dict().items():
            th.testing.assert_close(restored[name], tensor, msg=f"agent {agent!r}, parameter {name}")


def test_load_restores_each_agents_optimizer_state(saved: tuple[IPPO, pathlib.Path]) -> None:
    model, path = saved
    loaded = type(model).load(path)
    for agent, policy in model.policies.items():
        assert policy.optimizer.state_dict()["state"], "the saved model has taken Adam steps"
        assert_same_optimizer_state(loaded.policies[agent].optimizer, policy.optimizer)


def test_load_restores_observation_normalization_statistics(saved: tuple[IPPO, pathlib.Path]) -> None:
    model, path = saved
    loaded = type(model).load(path)
    assert model.obs_normalizers is not None and loaded.obs_normalizers is not None
    for agent, normalizer in model.obs_normalizers.items():
        saved_rms, restored_rms = normalizer.obs_rms, loaded.obs_normalizers[agent].obs_rms
        if not isinstance(saved_rms, dict):
            saved_rms, restored_rms = {"": saved_rms}, {"": restored_rms}
        assert isinstance(restored_rms, dict) and restored_rms.keys() == saved_rms.keys()  # MAPPO: own obs and critic input
        for key, entry in saved_rms.items():
            assert entry.count > 1
            np.testing.assert_array_equal(restored_rms[key].mean, entry.mean)
            np.testing.assert_array_equal(restored_rms[key].var, entry.var)
            assert restored_rms[key].count == entry.count


def test_load_restores_return_normalization_statistics(saved: tuple[IPPO, pathlib.Path]) -> None:
    model, path = saved
    loaded = type(model).load(path)
    assert model.return_normalizers is not None and loaded.return_normalizers is not None
    for agent, normalizer in model.return_normalizers.items():
        saved_rms, restored_rms = normalizer.return_rms, loaded.return_normalizers[agent].return_rms
        assert saved_rms.count > 1
        assert (restored_rms.mean, restored_rms.var, restored_rms.count) == (saved_rms.mean, saved_rms.var, saved_rms.count)


def test_load_restores_policy_version_and_counters(saved: tuple[IPPO, pathlib.Path]) -> None:
    model, path = saved
    loaded = type(model).load(path)
    assert loaded.policy_version == model.policy_version
    assert loaded.num_timesteps == model.num_timesteps
    assert loaded.stale_episodes_dropped == model.stale_episodes_dropped


def test_load_restores_hyperparameters(saved: tuple[IPPO, pathlib.Path]) -> None:
    model, path = saved
    loaded = type(model).load(path)
    names = ("n_episodes", "n_epochs", "max_version_lag", "normalize_obs", "normalize_returns", "gamma", "gae_lambda")
    for name in (*names, "time_limit_bootstrap"):
        assert getattr(loaded, name) == getattr(model, name), name
    assert loaded.policy_kwargs == model.policy_kwargs


def test_deterministic_predictions_are_identical_after_load(saved: tuple[IPPO, pathlib.Path]) -> None:
    model, path = saved
    observations = observation_batch(model)
    expected, _ = model.predict(observations, deterministic=True)
    actions, _ = type(model).load(path).predict(observations, deterministic=True)
    assert_same_actions(actions, expected)


def test_load_without_env_predicts(saved: tuple[IPPO, pathlib.Path]) -> None:
    model, path = saved
    loaded = type(model).load(path, env=None)
    assert loaded.get_env() is None
    observation = {agent: obs[0] for agent, obs in observation_batch(model).items()}
    actions, state = loaded.predict(observation, deterministic=True)
    assert state is None
    assert_same_actions(actions, model.predict(observation, deterministic=True)[0])


def test_learn_without_env_after_load_is_a_clear_error(saved: tuple[IPPO, pathlib.Path]) -> None:
    model, path = saved
    with pytest.raises(ValueError, match="environment"):
        type(model).load(path).learn(10)


def test_learn_continues_after_load(saved: tuple[IPPO, pathlib.Path]) -> None:
    model, path = saved
    # Two copies where the model was trained on three: only the agents and spaces must match.
    loaded = type(model).load(path, env=make_algo_vec_env(type(model), DyingAgentsEnv, n_envs=2, seed=1))
    loaded.learn(24, reset_num_timesteps=False)
    assert loaded.num_timesteps == model.num_timesteps + 24
    assert loaded.policy_version > model.policy_version
    for agent, policy in model.policies.items():
        adam_steps = [state["step"] for state in loaded.policies[agent].optimizer.state.values()]
        saved_adam_steps = [state["step"] for state in policy.optimizer.state.values()]
        assert all(after > before for after, before in zip(adam_steps, saved_adam_steps, strict=True)), agent


def test_load_maps_the_model_to_the_requested_device(saved: tuple[IPPO, pathlib.Path]) -> None:
    model, path = saved
    loaded = type(model).load(path, device="cpu")
    assert loaded.device == th.device("cpu")
    for agent, policy in loaded.policies.items():
        assert {parameter.device.type for parameter in policy.parameters()} == {"cpu"}, agent
        for state in policy.optimizer.state.values():
            assert state["exp_avg"].device.type == "cpu", agent


def test_save_and_load_through_a_file_object(saved: tuple[IPPO, pathlib.Path]) -> None:
    model, _ = saved
    buffer = io.BytesIO()
    model.save(buffer)
    buffer.seek(0)
    loaded = type(model).load(buffer)
    observations = observation_batch(model)
    assert_same_actions(
        loaded.predict(observations, deterministic=True)[0], model.predict(observations, deterministic=True)[0]
    )


def test_load_onto_an_env_with_other_agents_names_the_agent(saved: tuple[IPPO, pathlib.Path]) -> None:
    model, path = saved
    other_agents = DyingAgentsEnv(death_steps={"agent_0": 2, "agent_1": 4, "scout": None})
    with pytest.raises(ValueError, match="agent_2"):
        type(model).load(path, env=other_agents)


@pytest.mark.parametrize("kind", ["observation", "action"])
def test_load_onto_an_env_with_other_spaces_names_the_agent(saved: tuple[IPPO, pathlib.Path], kind: str) -> None:
    model, path = saved
    env = DyingAgentsEnv()
    if kind == "observation":
        env.observation_spaces["agent_1"] = spaces.Box(0.0, 1.0, (3,), np.float32)
    else:
        env.action_spaces["agent_1"] = spaces.Discrete(3)
    with pytest.raises(ValueError, match=f"agent_1.*{kind}"):
        type(model).load(path, env=env)


def test_set_env_with_other_agents_names_the_agent() -> None:
    model = make_model()
    with pytest.raises(ValueError, match="agent_2"):
        model.set_env(DyingAgentsEnv(death_steps={"agent_0": 2, "agent_1": None}))


@pytest.mark.parametrize("trusted", [True, False])
def test_load_of_a_missing_zip_names_the_path_given(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, trusted: bool
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError, match=r"^No model file 'nope\.zip'$"):
        IPPO.load("nope.zip", trusted=trusted)


def test_load_of_a_missing_name_without_suffix_says_which_files_it_tried(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError, match=r"^No model file 'nope' \(tried nope, nope\.zip and nope\.safetensors\)$"):
        IPPO.load("nope")


def test_load_of_a_name_without_suffix_reads_the_zip_as_sb3_does(saved: tuple[IPPO, pathlib.Path]) -> None:
    model, path = saved
    loaded = type(model).load(path.with_suffix(""))
    assert loaded.policy_version == model.policy_version


@pytest.mark.parametrize("content", ["not a zip", "truncated zip"])
def test_load_a_corrupt_file_is_a_clear_error(tmp_path: pathlib.Path, content: str) -> None:
    path = tmp_path / "broken.zip"
    if content == "not a zip":
        path.write_bytes(b"this is not a zip file")
    else:
        make_model().save(path)
        path.write_bytes(path.read_bytes()[:200])
    with pytest.raises(ValueError, match="zip"):
        IPPO.load(path)


def test_load_a_plain_ppo_zip_is_a_clear_error(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "ppo.zip"
    PPO("MlpPolicy", gym.make("CartPole-v1"), n_steps=16, batch_size=16, policy_kwargs=dict(net_arch=[16])).save(path)
    with pytest.raises(ValueError, match="not an IPPO model"):
        IPPO.load(path)


def test_agent_ids_that_torch_module_names_cannot_hold_save_and_load(tmp_path: pathlib.Path) -> None:
    # "team.a-1" and "team.a_1" also collide once made into module names.
    agents = {"team.a-1": 2, "team b.2": 4, "team.a_1": None}
    model = make_model(DyingAgentsEnv(death_steps=agents))
    model.learn(24)
    model.save(tmp_path / "odd_ids.zip")
    loaded = IPPO.load(tmp_path / "odd_ids.zip", env=DyingAgentsEnv(death_steps=agents))
    assert list(loaded.policies) == list(agents)
    for agent, policy in model.policies.items():
        restored = loaded.policies[agent].state_dict()
        for name, tensor in policy.state_dict().items():
            th.testing.assert_close(restored[name], tensor, msg=f"agent {agent!r}, parameter {name}")
        assert_same_optimizer_state(loaded.policies[agent].optimizer, policy.optimizer)
    observations = observation_batch(model)
    assert_same_actions(
        loaded.predict(observations, deterministic=True)[0], model.predict(observations, deterministic=True)[0]
    )


@pytest.mark.parametrize(
    ("env_fn", "agent"),
    [
        (DyingAgentsEnv, "agent_1"),
        (lambda: HeterogeneousEnv(agents=["box", "multi_discrete", "multi_binary"]), "box"),
        (lambda: HeterogeneousEnv(agents=["box", "multi_discrete", "multi_binary"]), "multi_discrete"),
        (lambda: HeterogeneousEnv(agents=["box", "multi_discrete", "multi_binary"]), "multi_binary"),
    ],
)
def test_export_agent_gives_a_ppo_zip_with_the_same_deterministic_actions(
    tmp_path: pathlib.Path, env_fn: Any, agent: str
) -> None:
    model = make_model(env_fn())
    model.learn(16)
    model.export_agent(agent, tmp_path / "agent.zip")
    ppo = PPO.load(tmp_path / "agent.zip")
    assert ppo.observation_space == model.observation_spaces[agent]
    assert ppo.action_space == model.action_spaces[agent]
    observations = observation_batch(model, n=32)[agent]
    expected, _ = model.predict({agent: observations}, deterministic=True)
    actions, _ = ppo.predict(observations, deterministic=True)
    np.testing.assert_array_equal(actions, expected[agent])


def test_export_agent_refuses_an_unknown_agent(tmp_path: pathlib.Path) -> None:
    with pytest.raises(KeyError, match="scout"):
        make_model().export_agent("scout", tmp_path / "agent.zip")


def trained_parameters(seed: int) -> dict[str, dict[str, th.Tensor]]:
    model = make_model(seed=seed)
    model.learn(36)
    return {agent: policy.state_dict() for agent, policy in model.policies.items()}


def test_same_seed_gives_same_trained_parameters() -> None:
    first, second, other_seed = trained_parameters(3), trained_parameters(3), trained_parameters(4)
    assert_same_parameters(first, second)
    # The comparison can tell models apart: another seed trains other parameters.
    assert any(not th.equal(other_seed["agent_0"][name], tensor) for name, tensor in first["agent_0"].items())
