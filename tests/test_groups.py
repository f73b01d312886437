"""Agent groups: how agents are grouped, the batched path against the one-agent-at-a-time reference, parameter
sharing and per-group settings."""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import pytest
import torch as th
from gymnasium import spaces
from mpe2 import simple_adversary_v3
from stable_baselines3.common.logger import configure
from stable_baselines3.common.policies import ActorCriticPolicy, MultiInputActorCriticPolicy

import sb3_ippo.update.runners as runners_module
from sb3_ippo import IPPO, make_vec_env
from sb3_ippo.common.buffer import Trajectory
from sb3_ippo.common.normalization import ReturnNormalizer
from sb3_ippo.update.batch import build_batch
from sb3_ippo.update.ppo import ppo_update
from sb3_ippo.common.preprocessing import policy_observation_space
from sb3_ippo.update.stacked import StackedPolicies
from sb3_ippo.update.stacked_update import stacked_build_batch, stacked_ppo_update
from sb3_ippo.update.settings import UpdateSettings
from tests.helpers import (
    EPISODE_LENGTH,
    assert_same_parameters,
    make_policies,
    make_model,
    parameters,
    sampled_trajectories,
    settings,
    stacked_groups,
)
from tests.envs import DyingAgentsEnv, HeterogeneousEnv

ACTION_SPACES = {
    "discrete": spaces.Discrete(3),
    "box": spaces.Box(-1.0, 1.0, (2,), np.float32),
    "multi_discrete": spaces.MultiDiscrete([2, 3]),
    "multi_binary": spaces.MultiBinary(3),
}


def member_trajectories(policies: list[ActorCriticPolicy]) -> list[list[Trajectory]]:
    """Different lengths per member, truncated and terminated trajectories mixed."""
    ends = [[(5, False), (7, True), (3, False)], [(9, True), (4, False)], [(2, True), (6, False), (6, True), (1, False)]]
    return [sampled_trajectories(policy, ends[i % 3], seed=i) for i, policy in enumerate(policies)]


def assert_same_policies(first: list[ActorCriticPolicy], second: list[ActorCriticPolicy], atol: float = 1e-5) -> None:
    for index, (a, b) in enumerate(zip(first, second, strict=True)):
        for (name, p), q in zip(a.named_parameters(), b.parameters(), strict=True):
            assert th.allclose(p, q, rtol=1e-5, atol=atol), f"member {index}, {name}: {(p - q).abs().max()}"
        for p, q in zip(a.parameters(), b.parameters(), strict=True):
            state_a, state_b = a.optimizer.state.get(p, {}), b.optimizer.state.get(q, {})
            assert state_a.keys() == state_b.keys()
            if state_a:
                assert state_a["step"].item() == state_b["step"].item()
                assert th.allclose(state_a["exp_avg"], state_b["exp_avg"], rtol=1e-3, atol=1e-7)
                assert th.allclose(state_a["exp_avg_sq"], state_b["exp_avg_sq"], rtol=1e-4, atol=1e-9)


def run_both_paths(
    policies: list[ActorCriticPolicy], normalize_returns: bool = False, **update_kwargs: Any
) -> tuple[list[ActorCriticPolicy], list[ActorCriticPolicy], list[Any], list[Any]]:
    """The same trajectories through the reference path (member by member) and the batched path."""
    trajectories = member_trajectories(policies)
    reference = copy.deepcopy(policies)
    shuffle = update_kwargs.get("shuffle_minibatches", False)

    def generators() -> list[th.Generator | None]:
        return [th.Generator().manual_seed(100 + i) if shuffle else None for i in range(len(policies))]

    normalizers = [ReturnNormalizer() for _ in policies] if normalize_returns else None
    reference_normalizers = copy.deepcopy(normalizers)
    reference_stats = []
    for i, (policy, member) in enumerate(zip(reference, trajectories, strict=True)):
        normalizer = None if reference_normalizers is None else reference_normalizers[i]
        batch = build_batch(policy, member, settings(), return_normalizer=normalizer)
        reference_stats.append(ppo_update(policy, batch, settings(**update_kwargs), generator=generators()[i]))
    stacked = StackedPolicies(policies)
    batch = stacked_build_batch(stacked, trajectories, settings(), return_normalizers=normalizers)
    stats = stacked_ppo_update(stacked, batch, settings(**update_kwargs), generators=generators())
    return policies, reference, stats, reference_stats


@pytest.mark.parametrize("kind", list(ACTION_SPACES))
@pytest.mark.parametrize("kl_stop", ["after_step", "before_step"])
def test_the_batched_update_equals_the_reference_path(kind: str, kl_stop: str) -> None:
    policies = make_policies(3, ACTION_SPACES[kind], learning_rate=3e-3)

    batched, reference, stats, reference_stats = run_both_paths(
        policies, n_epochs=10, batch_size=4, target_kl=0.004, kl_stop=kl_stop, ent_coef=0.01, clip_range_vf=0.2
    )

    assert_same_policies(batched, reference)
    passes = [s.n_epochs_run for s in reference_stats]
    assert [s.n_epochs_run for s in stats] == passes
    # The point of the test: members stopped at different passes, and before the last.
    assert len(set(passes)) > 1 and max(passes) < 10, passes
    for s, r in zip(stats, reference_stats, strict=True):
        assert (s.n_transitions, s.n_trajectories) == (r.n_transitions, r.n_trajectories)
        for name in ("policy_loss", "value_loss", "approx_kl", "entropy_loss", "clip_fraction", "explained_variance"):
            assert getattr(s, name) == pytest.approx(getattr(r, name), rel=1e-4, abs=1e-6), name


def test_the_batched_update_equals_the_reference_with_return_normalization_and_shuffled_minibatches() -> None:
    policies = make_policies(3, ACTION_SPACES["discrete"])

    batched, reference, stats, reference_stats = run_both_paths(
        policies, normalize_returns=True, n_epochs=6, batch_size=5, target_kl=None, shuffle_minibatches=True
    )

    assert_same_policies(batched, reference)
    assert [s.n_epochs_run for s in stats] == [r.n_epochs_run for r in reference_stats] == [6, 6, 6]


@pytest.mark.parametrize(
    "observation_space",
    [
        spaces.Dict({"position": spaces.Box(-1.0, 1.0, (3,), np.float32), "mode": spaces.Discrete(4)}),
        policy_observation_space(spaces.Box(0, 255, (36, 36, 3), np.uint8)),
    ],
    ids=["multi_input", "cnn"],
)
def test_the_batched_update_equals_the_reference_for_dict_and_image_observations(observation_space: spaces.Space) -> None:
    policies = make_policies(2, spaces.Discrete(3), observation_space)

    batched, reference, stats, _ = run_both_paths(policies, n_epochs=3, batch_size=6, target_kl=None)

    assert_same_policies(batched, reference, atol=1e-5)
    assert [s.n_epochs_run for s in stats] == [3, 3]


def test_a_stopped_member_keeps_its_parameters_and_optimizer_state_exactly() -> None:
    policies = make_policies(3, ACTION_SPACES["discrete"])
    # A tiny target: every member stops in its second pass, each after its own number of steps.
    batched, reference, stats, _ = run_both_paths(policies, n_epochs=10, batch_size=4, target_kl=1e-9, kl_stop="before_step")

    for policy in batched:
        steps = {int(state["step"]) for state in policy.optimizer.state.values()}
        assert len(steps) == 1
    assert [s.n_epochs_run for s in stats] == [1, 1, 1]
    assert_same_policies(batched, reference)


@pytest.mark.parametrize("kind", list(ACTION_SPACES))
def test_acting_with_stacked_networks_equals_each_policy(kind: str) -> None:
    policies = make_policies(3, ACTION_SPACES[kind])
    stacked = StackedPolicies(policies)
    obs = th.as_tensor(np.stack([np.random.default_rng(i).uniform(-1, 1, (5, 4)).astype(np.float32) for i in range(3)]))

    with th.no_grad():
        outputs = stacked.act(stacked.gather(), obs, range(3), deterministic=True)
        for index, ((actions, values, log_probs), policy) in enumerate(zip(outputs, policies, strict=True)):
            expected_actions, expected_values, expected_log_probs = policy(obs[index], deterministic=True)
            if kind == "box":  # continuous: the same means, up to float rounding
                assert th.allclose(actions, expected_actions, atol=1e-6)
            else:
                assert th.equal(actions, expected_actions)
            assert th.allclose(values, expected_values.flatten(), atol=1e-6)
            assert th.allclose(log_probs, expected_log_probs, atol=1e-5)


def test_acting_follows_parameter_changes() -> None:
    policies = make_policies(2, ACTION_SPACES["discrete"])
    stacked = StackedPolicies(policies)
    before = stacked.gather()["value_net.bias"].clone()
    with th.no_grad():
        policies[1].value_net.bias += 1.0

    assert th.equal(stacked.gather()["value_net.bias"], before + th.tensor([[0.0], [1.0]]))


# --- IPPO with groups ------------------------------------------------------------------------------------------------


def test_agents_are_grouped_by_id_prefix_and_spaces() -> None:
    model = make_model(simple_adversary_v3.parallel_env(N=2, max_cycles=5))
    assert dict(model.groups) == {"adversary": ["adversary_0"], "agent": ["agent_0", "agent_1"]}

    heterogeneous = IPPO("MultiInputPolicy", HeterogeneousEnv(["dict"]), seed=0)
    assert dict(heterogeneous.groups) == {"dict": ["dict"]}


def test_agents_with_one_prefix_and_different_spaces_form_separate_groups() -> None:
    env = DyingAgentsEnv(death_steps={"unit_0": None, "unit_1": None})
    env.observation_spaces["unit_1"] = spaces.Box(0.0, 1.0, (2,), np.float64)
    assert dict(make_model(env).groups) == {"unit": ["unit_0"], "unit_1": ["unit_1"]}


def test_user_groups_and_their_errors() -> None:
    model = make_model(groups={"pair": ["agent_0", "agent_2"]})
    assert dict(model.groups) == {"pair": ["agent_0", "agent_2"], "agent": ["agent_1"]}
    with pytest.raises(ValueError, match="'nobody'"):
        make_model(groups={"pair": ["agent_0", "nobody"]})
    with pytest.raises(ValueError, match="two groups"):
        make_model(groups={"a": ["agent_0"], "b": ["agent_0"]})
    with pytest.raises(ValueError, match=r"unknown groups \['adversary'\]"):
        make_model(group_kwargs={"adversary": dict(learning_rate=1e-3)})
    with pytest.raises(ValueError, match=r"unknown settings \['n_episodes'\]"):
        make_model(group_kwargs={"agent": dict(n_episodes=3)})
    with pytest.raises(ValueError, match="unknown groups"):
        make_model(share_parameters={"adversary": True})


def test_model_groups_is_read_only() -> None:
    with pytest.raises(TypeError):
        make_model().groups["new"] = ["agent_0"]  # type: ignore[index]


def seeded_trajectories(model: IPPO, seed: int) -> dict[str, list[Trajectory]]:
    """Two trajectories per agent, sampled by the agent's policy, of different lengths."""
    return {
        agent: sampled_trajectories(policy, [(3 + index, False), (5, True)], seed=seed + index)
        for index, (agent, policy) in enumerate(model.policies.items())
    }


def trained_on(model: IPPO, trajectories: dict[str, list[Trajectory]]) -> IPPO:
    model.set_logger(configure(None, [""]))
    for agent, agent_trajectories in trajectories.items():
        model.buffers[agent].finished.extend(copy.deepcopy(agent_trajectories))
    model.train()
    return model


@pytest.mark.parametrize("kwargs", [{}, dict(normalize_returns=True, normalize_obs=True, shuffle_minibatches=True)])
def test_an_ippo_update_is_the_same_batched_and_one_agent_at_a_time(kwargs: dict[str, Any]) -> None:
    settings = dict(n_epochs=8, batch_size=3, target_kl=0.01, learning_rate=0.01, **kwargs)
    batched, reference = make_model(batched=True, **settings), make_model(batched=False, **settings)
    assert stacked_groups(batched) == {"agent"} and not stacked_groups(reference)
    assert_same_parameters(parameters(batched), parameters(reference))
    trajectories = seeded_trajectories(batched, seed=0)
    th.manual_seed(0)
    trained_on(batched, trajectories)
    th.manual_seed(0)
    trained_on(reference, trajectories)

    for agent in batched.possible_agents:
        for name, p in batched.policies[agent].named_parameters():
            assert th.allclose(p, reference.policies[agent].get_parameter(name), rtol=1e-5, atol=1e-6), (agent, name)
        assert batched.update_stats[agent].n_epochs_run == reference.update_stats[agent].n_epochs_run


def test_a_groups_time_limit_bootstrap_is_the_same_batched_and_one_agent_at_a_time() -> None:
    settings = dict(n_epochs=4, batch_size=3, target_kl=None, learning_rate=0.01)
    episodic = dict(group_kwargs={"agent": {"time_limit_bootstrap": False}})
    trajectories = seeded_trajectories(make_model(), seed=0)
    for agent_trajectories in trajectories.values():
        agent_trajectories[0].truncated = True  # a time limit, not a rollout_len cut
    models = {}
    for name, kwargs in (
        ("batched", dict(batched=True, **episodic)),
        ("reference", dict(batched=False, **episodic)),
        ("bootstrapping", {}),
    ):
        th.manual_seed(0)
        models[name] = trained_on(make_model(**settings, **kwargs), trajectories)

    def close(first: IPPO, second: IPPO) -> bool:
        return all(
            th.allclose(p, second.policies[agent].get_parameter(name), rtol=1e-5, atol=1e-6)
            for agent in first.possible_agents
            for name, p in first.policies[agent].named_parameters()
        )

    assert "agent" in stacked_groups(models["batched"]) and not stacked_groups(models["reference"])
    assert close(models["batched"], models["reference"])
    assert not close(models["bootstrapping"], models["reference"])  # the setting changes the update


def test_batched_training_runs_and_learns_like_sb3_expects() -> None:
    model = make_model(make_vec_env(DyingAgentsEnv, n_envs=2))
    model.learn(4 * 2 * EPISODE_LENGTH)
    assert model.policy_version >= 3
    assert set(model.update_stats) == {"agent_0", "agent_1", "agent_2"}


def test_a_group_that_cannot_be_stacked_falls_back_to_the_reference_path_with_a_warning() -> None:
    sgd = dict(net_arch=[16], optimizer_class=th.optim.SGD)
    with pytest.warns(UserWarning, match="'agent' is trained one agent at a time.*torch.optim.Adam"):
        model = make_model(group_kwargs={"agent": dict(policy_kwargs=sgd)})
    assert not stacked_groups(model)
    model.learn(2 * EPISODE_LENGTH)
    assert model.policy_version == 1


def test_shared_parameters_train_one_network_on_all_members_data(monkeypatch: pytest.MonkeyPatch) -> None:
    model = make_model(share_parameters=True, normalize_obs=True, normalize_returns=True)
    policies = model.policies
    assert policies["agent_0"] is policies["agent_1"] is policies["agent_2"]
    assert model.obs_normalizers["agent_0"] is model.obs_normalizers["agent_2"]  # type: ignore[index]
    batches: list[int] = []
    build = runners_module.build_batch

    def spy(policy: ActorCriticPolicy, trajectories: list[Trajectory], *args: Any, **kwargs: Any) -> Any:
        batches.append(len(trajectories))
        return build(policy, trajectories, *args, **kwargs)

    monkeypatch.setattr(runners_module, "build_batch", spy)
    before = {name: p.detach().clone() for name, p in policies["agent_0"].named_parameters()}
    model.learn(2 * EPISODE_LENGTH)

    assert batches == [3 * 2]  # one batch: every agent's 2 trajectories
    assert any(not th.equal(p, before[name]) for name, p in policies["agent_0"].named_parameters())
    assert len({id(stats) for stats in model.update_stats.values()}) == 1


def test_shared_parameters_per_group_and_heterogeneous_groups_side_by_side() -> None:
    model = make_model(simple_adversary_v3.parallel_env(N=2, max_cycles=5), share_parameters={"agent": True})
    policies = model.policies
    assert policies["agent_0"] is policies["agent_1"]
    assert policies["adversary_0"] is not policies["agent_0"]
    model.learn(2 * 5)
    assert model.policy_version == 1


def test_shared_parameters_need_the_same_spaces() -> None:
    with pytest.raises(ValueError, match="same observation and action spaces"):
        IPPO("MultiInputPolicy", HeterogeneousEnv(["dict", "discrete"]), groups={"all": ["dict", "discrete"]},
             share_parameters=True)


def test_save_and_load_keep_shared_parameters_shared(tmp_path: Any) -> None:
    model = make_model(share_parameters=True)
    model.learn(2 * EPISODE_LENGTH)
    model.save(tmp_path / "shared.zip")

    loaded = IPPO.load(tmp_path / "shared.zip", env=DyingAgentsEnv())

    assert loaded.policies["agent_0"] is loaded.policies["agent_2"]
    assert_same_parameters(parameters(loaded), parameters(model))
    obs = {agent: np.array([0.5, 1.0], dtype=np.float32) for agent in model.possible_agents}
    assert loaded.predict(obs, deterministic=True)[0] == model.predict(obs, deterministic=True)[0]
    loaded.learn(2 * EPISODE_LENGTH, reset_num_timesteps=False)
    assert loaded.policy_version == 2


def test_group_kwargs_set_a_groups_hyperparameters_and_policy() -> None:
    env = simple_adversary_v3.parallel_env(N=2, max_cycles=5)
    model = make_model(env, group_kwargs={"adversary": dict(learning_rate=1e-3, n_epochs=1, policy_kwargs=dict(net_arch=[8]))})
    model.learn(2 * 5)
    assert model.policies["adversary_0"].optimizer.param_groups[0]["lr"] == 1e-3
    assert model.policies["agent_0"].optimizer.param_groups[0]["lr"] == 3e-4
    assert model.policies["adversary_0"].value_net.in_features == 8
    assert model.update_stats["adversary_0"].n_epochs_run == 1


def test_group_kwargs_set_minibatch_shuffling_and_advantage_normalization(monkeypatch: pytest.MonkeyPatch) -> None:
    env = simple_adversary_v3.parallel_env(N=2, max_cycles=5)
    seen: dict[int, tuple[bool, bool]] = {}
    update = runners_module.ppo_update

    def spy(policy: ActorCriticPolicy, batch: Any, settings: UpdateSettings, *args: Any) -> Any:
        seen[id(policy)] = (settings.shuffle_minibatches, settings.normalize_advantage)
        return update(policy, batch, settings, *args)

    monkeypatch.setattr(runners_module, "ppo_update", spy)
    settings = dict(shuffle_minibatches=True, normalize_advantage=False)
    model = make_model(env, batched=False, batch_size=3, group_kwargs={"adversary": settings})
    model.learn(2 * 5)
    assert seen[id(model.policies["adversary_0"])] == (True, False)
    assert seen[id(model.policies["agent_0"])] == seen[id(model.policies["agent_1"])] == (False, True)

    # Every group shuffling by its own setting draws the same permutations as the model-wide setting.
    shuffled = {"adversary": {"shuffle_minibatches": True}, "agent": {"shuffle_minibatches": True}}
    everyone = make_model(simple_adversary_v3.parallel_env(N=2, max_cycles=5), batch_size=3, group_kwargs=shuffled)
    everyone.learn(2 * 5)  # before the next model is made: making one seeds torch's global generator
    model_wide = make_model(simple_adversary_v3.parallel_env(N=2, max_cycles=5), batch_size=3, shuffle_minibatches=True)
    model_wide.learn(2 * 5)
    assert_same_parameters(parameters(everyone), parameters(model_wide))
    unshuffled = make_model(simple_adversary_v3.parallel_env(N=2, max_cycles=5), batch_size=3)
    unshuffled.learn(2 * 5)
    with pytest.raises(AssertionError):  # the permutations matter: the comparison above can fail
        assert_same_parameters(parameters(unshuffled), parameters(model_wide))


def test_group_kwargs_let_dict_and_vector_observations_mix() -> None:
    env = HeterogeneousEnv(["dict", "discrete", "box"])
    model = IPPO("MlpPolicy", env, n_episodes=2, n_epochs=1, policy_kwargs=dict(net_arch=[8]), seed=0,
                 group_kwargs={"dict": dict(policy="MultiInputPolicy")})
    assert isinstance(model.policies["dict"], MultiInputActorCriticPolicy)
    model.learn(2 * 4)
    assert model.policy_version == 1
    with pytest.raises(ValueError, match="'dict' has a Dict observation space"):
        IPPO("MlpPolicy", env)


@pytest.mark.parametrize("suffix", ["zip", "safetensors"])
def test_shared_and_stacked_groups_round_trip_through_every_format(tmp_path: Any, suffix: str) -> None:
    env = simple_adversary_v3.parallel_env(N=3, max_cycles=5)
    model = make_model(env, share_parameters={"agent": True}, groups={"agent": ["agent_0", "agent_1"]},
                       group_kwargs={"agent": dict(learning_rate=1e-3)}, normalize_obs=True)
    model.learn(2 * 5)
    model.save(tmp_path / f"model.{suffix}")

    loaded = IPPO.load(tmp_path / f"model.{suffix}", env=simple_adversary_v3.parallel_env(N=3, max_cycles=5))

    assert dict(loaded.groups) == dict(model.groups)
    assert loaded.policies["agent_0"] is loaded.policies["agent_1"]
    assert stacked_groups(loaded) == stacked_groups(model)
    assert_same_parameters(parameters(loaded), parameters(model))
    assert loaded.policies["agent_0"].optimizer.param_groups[0]["lr"] == 1e-3
    loaded.learn(2 * 5, reset_num_timesteps=False)
    assert loaded.policy_version == 2


def test_export_agent_uses_its_groups_policy_settings(tmp_path: Any) -> None:
    from stable_baselines3 import PPO

    env = simple_adversary_v3.parallel_env(N=2, max_cycles=5)
    model = make_model(env, group_kwargs={"adversary": dict(policy_kwargs=dict(net_arch=[8]), learning_rate=1e-3)})
    model.learn(2 * 5)
    model.export_agent("adversary_0", tmp_path / "adversary.zip")

    exported = PPO.load(tmp_path / "adversary.zip")
    obs = np.zeros((3, 8), dtype=np.float32)
    assert exported.policy.value_net.in_features == 8
    np.testing.assert_array_equal(exported.predict(obs, deterministic=True)[0],
                                  model.predict({"adversary_0": obs}, deterministic=True)[0]["adversary_0"])
