"""Bad input gets a clear error: every hyperparameter is validated with a message that names it and says what is
expected, and the mistakes a new user makes (a policy name typo, a wrong observation shape, an env function
passed uncalled, a turn-based game, a budget of 0) say what was wrong and how to fix it. A budget that ends
before the first update is a warning, not silence."""

from __future__ import annotations

import re
import warnings
from typing import Any

import numpy as np
import pytest
from gymnasium import spaces
from mpe2 import simple_spread_v3
from pettingzoo.classic import tictactoe_v3
from sb3_contrib.ppo_recurrent import MlpLstmPolicy
from stable_baselines3.common.utils import LinearSchedule
from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize

from sb3_ippo import IPPO, make_vec_env
from sb3_ippo.hyperparams.validation import RULES
from tests.envs import DyingAgentsEnv, HeterogeneousEnv
from tests.helpers import make_model, record_logs

# --- every hyperparameter -------------------------------------------------------------------------------------------

BAD_VALUES: list[tuple[str, Any, str]] = [
    ("learning_rate", 0.0, "a positive number or a schedule"),
    ("learning_rate", -1e-3, "a positive number or a schedule"),
    ("learning_rate", float("nan"), "a positive number"),
    ("learning_rate", "3e-4", "a positive number"),
    ("n_steps", 0, "a positive integer"),
    ("n_steps", 10.0, "a positive integer"),
    ("n_episodes", 0, "a positive integer"),
    ("n_episodes", True, "a positive integer"),
    ("batch_size", 0, "a positive integer"),
    ("batch_size", 2.5, "a positive integer"),
    ("n_epochs", 0, "a positive integer"),
    ("n_epochs", None, "a positive integer"),
    ("gamma", 1.5, "a number in [0, 1]"),
    ("gamma", -0.01, "a number in [0, 1]"),
    ("gamma", None, "a number in [0, 1]"),
    ("gae_lambda", -0.1, "a number in [0, 1]"),
    ("gae_lambda", float("nan"), "a number in [0, 1]"),
    ("clip_range", -0.1, "a positive number or a schedule"),
    ("clip_range", 0, "a positive number or a schedule"),
    ("clip_range_vf", -0.2, "None (no value clipping), a positive number"),
    ("clip_range_vf", 0.0, "None (no value clipping), a positive number"),
    ("normalize_advantage", "yes", "True or False"),
    ("ent_coef", -0.01, "a number >= 0"),
    ("ent_coef", float("inf"), "a number >= 0"),
    ("vf_coef", -0.5, "a number >= 0"),
    ("max_grad_norm", 0.0, "a positive number or None"),
    ("max_grad_norm", -1, "a positive number or None"),
    ("target_kl", 0.0, "a positive number or None"),
    ("max_version_lag", -1, "a non-negative integer"),
    ("max_version_lag", 0.5, "a non-negative integer"),
    ("recompute_values", 1, "True or False"),
    ("recompute_log_prob", None, "True or False"),
    ("shuffle_minibatches", "False", "True or False"),
    ("time_limit_bootstrap", 0, "True (a truncated episode bootstraps V(s_T)) or False (it bootstraps 0)"),
    ("normalize_obs", 0, "True or False"),
    ("use_sde", "yes", "True or False"),
    ("sde_sample_freq", 2.5, "an integer: new gSDE exploration matrices every n env steps, or -1"),
    ("normalize_returns", None, "True or False"),
    ("align_rollouts", "yes", "True or False"),
    ("rollout_len", 0, "a positive integer"),
    ("max_episode_steps", -5, "a positive integer"),
    ("max_buffered_episodes", 0, "a positive integer"),
    ("async_training", "no", "True (a learner process), False (updates in this process) or \"auto\""),
    ("kl_stop", "after", '"after_step" (the reference) or "before_step" (SB3)'),
    ("version_stamp", None, '"episode_end" (the reference) or "first_step"'),
    ("groups", ["agent_0"], "a dict {group name: [agent ids]} or None"),
    ("share_parameters", "yes", "True, False or a dict {group name: bool}"),
    ("group_kwargs", {"agent": 0.01}, "a dict {group name: {setting: value}} or None"),
    ("batched", 1, "True or False"),
    ("opponents", ["random"], "a dict {seat: opponent}"),
    ("self_play_pool", dict(snapshot_every=0, size=2), "dict(snapshot_every=K, size=M) with positive integers"),
    ("stats_window_size", 0, "a positive integer"),
    ("policy_kwargs", "dict(net_arch=[16])", "a dict such as dict(net_arch=[64, 64])"),
    ("verbose", -1, "0 (no output), 1"),
    ("seed", 1.5, "an integer or None"),
    ("tensorboard_log", 3, "a folder path or None"),
]


def test_a_bad_group_setting_names_the_group_and_the_setting() -> None:
    with pytest.raises(ValueError, match=r"^group_kwargs\['agent'\]: ent_coef must be a number >= 0; got -1$"):
        make_model(group_kwargs={"agent": dict(ent_coef=-1)})


def test_every_hyperparameter_has_a_rule() -> None:
    import inspect

    names = set(inspect.signature(IPPO.__init__).parameters) - {"self", "policy", "env", "device", "_init_setup_model"}
    assert names == set(RULES)
    assert {name for name, _, _ in BAD_VALUES} == set(RULES)  # and a test of a bad value


@pytest.mark.parametrize(("name", "value", "expected"), BAD_VALUES, ids=[f"{n}={v!r}" for n, v, _ in BAD_VALUES])
def test_a_bad_hyperparameter_names_itself_and_what_is_expected(name: str, value: Any, expected: str) -> None:
    with pytest.raises(ValueError, match=rf"^{name} must be {re.escape(expected)}.*; got {re.escape(repr(value))}$"):
        make_model(**{name: value})


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(gamma=0.0, gae_lambda=1.0),
        dict(gamma=1, gae_lambda=0),
        dict(learning_rate=LinearSchedule(1e-3, 0.0, 1.0), clip_range=lambda progress: 0.1 + 0.1 * progress),
        dict(clip_range_vf=0.2, max_grad_norm=None, target_kl=None, ent_coef=0, vf_coef=0.0),
        dict(batch_size=np.int64(4), n_epochs=np.int32(2), normalize_obs=np.bool_(True)),
        dict(n_steps=30, n_episodes=None),
    ],
)
def test_valid_edge_values_are_accepted(kwargs: dict[str, Any]) -> None:
    make_model(**kwargs)


def test_n_episodes_none_with_n_steps_trains_by_steps() -> None:
    model = make_model(n_steps=12, n_episodes=None)  # agent_0's 2-step trajectories: 6 episodes per update
    model.learn(80)
    assert model.policy_version >= 2
    assert all(stats.n_transitions >= 12 for stats in model.update_stats.values())


def test_neither_n_episodes_nor_n_steps_is_refused_saying_what_to_set() -> None:
    with pytest.raises(ValueError, match=r"n_episodes and n_steps are both None.*Set n_episodes .* or n_steps"):
        make_model(n_episodes=None, n_steps=None, rollout_len=None)


def test_a_hyperparameter_changed_after_construction_is_checked_by_learn() -> None:
    model = make_model()
    model.clip_range = -0.1
    with pytest.raises(ValueError, match="clip_range must be a positive number"):
        model.learn(12)


# --- messages a new user met ------------------------------------------------------------------------------------------


def test_a_policy_name_typo_lists_the_valid_names() -> None:
    with pytest.raises(ValueError, match=r"Unknown policy 'MLPPolicy' \(did you mean 'MlpPolicy'\?\).*'CnnPolicy'"):
        IPPO("MLPPolicy", DyingAgentsEnv())


def test_a_recurrent_policy_on_a_dict_observation_says_to_use_multi_input_lstm_policy() -> None:
    with pytest.raises(ValueError, match=r"Dict observation space: use 'MultiInputPolicy' \(or 'MultiInputLstmPolicy'\)"):
        IPPO(MlpLstmPolicy, HeterogeneousEnv(), policy_kwargs=dict(net_arch=[8], lstm_hidden_size=8))


def test_a_wrong_observation_shape_in_predict_names_the_agent_and_the_expected_shape() -> None:
    model = IPPO("MlpPolicy", simple_spread_v3.parallel_env(N=2), policy_kwargs=dict(net_arch=[8]))
    with pytest.raises(ValueError, match=r"Agent 'agent_1'.*shape \(5,\).*expected shape \(\d+,\) or \(n, \*\(\d+,\)\)"):
        model.predict({"agent_0": np.zeros(model.observation_spaces["agent_0"].shape), "agent_1": np.zeros(5)})


@pytest.mark.parametrize("make", [lambda env: IPPO("MlpPolicy", env), lambda env: make_vec_env(lambda: env)])
def test_an_env_function_passed_uncalled_says_to_call_it(make: Any) -> None:
    with pytest.raises(TypeError, match=r"Got a function, not an environment: call it .*simple_spread_v3\.parallel_env\(\)"):
        make(simple_spread_v3.parallel_env)
    with pytest.raises(TypeError, match=r"Got the class DyingAgentsEnv, not an environment: call it"):
        make(DyingAgentsEnv)


def test_an_env_instance_given_to_make_vec_env_says_to_pass_the_function() -> None:
    with pytest.raises(TypeError, match=r"e\.g\. simple_spread_v3\.parallel_env, not called\), got the env"):
        make_vec_env(simple_spread_v3.parallel_env())  # type: ignore[arg-type]


def test_a_turn_based_game_is_stepped_turn_by_turn() -> None:
    # No more "not supported" message: the game trains (tests/test_games.py).
    assert type(IPPO("MlpPolicy", tictactoe_v3.env()).env).__name__ == "TurnBasedMultiAgentVecEnv"


def test_vec_normalize_points_to_normalize_obs() -> None:
    from stable_baselines3.common.env_util import make_vec_env as make_sb3_vec_env

    vec_env = VecNormalize(DummyVecEnv([lambda: make_sb3_vec_env("CartPole-v1").envs[0]]))
    with pytest.raises(TypeError, match=r"normalize_obs=True"):
        IPPO("MlpPolicy", vec_env)


@pytest.mark.parametrize("budget", [0, -100, 0.5, float("nan"), "1000", None])
def test_learn_with_no_budget_is_a_clear_error(budget: Any) -> None:
    expected = rf"total_timesteps must be a positive number of env steps, got {re.escape(repr(budget))}"
    with pytest.raises(ValueError, match=expected):
        make_model().learn(budget)


# --- no silent no-ops -------------------------------------------------------------------------------------------------


def test_learn_that_ends_without_an_update_warns_with_the_budget_that_would_give_one() -> None:
    model = make_model(n_episodes=8)  # 8 episodes of 6 steps: 48 env steps per update
    output = record_logs(model)
    warned = []
    model.logger.warn = warned.append  # type: ignore[method-assign]
    expected = r"ended after 24 env steps without a single update.*n_episodes=8 .* has 4\. About 48 env steps"
    with pytest.warns(UserWarning, match=expected):
        model.learn(24)
    assert model.policy_version == 0 and len(warned) == 1 and "without a single update" in warned[0]
    assert output.dumps == []


def test_learn_without_an_update_under_rollout_len_names_rollout_len() -> None:
    # One copy: an update when every agent has 128 transitions; agent_0 acts in 2 of every 6 steps.
    model = make_model(rollout_len=128, n_episodes=None)
    expected = (
        r"needs rollout_len=128 x the env copies: n_steps=128 transitions .* has 4\. About 384 env steps.*lower rollout_len"
    )
    with pytest.warns(UserWarning, match=expected):
        model.learn(12)


def test_an_sb3_habit_n_steps_2048_with_a_short_budget_warns() -> None:
    with pytest.warns(UserWarning, match=r"n_steps=2048 transitions.*About \d+ env steps would give one"):
        make_model(n_steps=2048).learn(100)


def test_an_episode_longer_than_the_budget_says_so() -> None:
    with pytest.warns(UserWarning, match="No trajectory finished within the budget.*max_episode_steps or rollout_len"):
        make_model().learn(3)


def test_a_budget_that_gives_an_update_does_not_warn() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        make_model().learn(12)
        make_model().learn(1.2e1)  # SB3 takes learn(1e5) too


def test_a_callback_that_stops_training_does_not_warn() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        make_model().learn(100, callback=lambda _locals, _globals: False)


def test_cnn_policy_on_vector_observations_names_the_agent_and_points_to_mlp_policy() -> None:
    with pytest.raises(ValueError, match=r"Agent 'agent_0' has the observation space Box\(.*not an image.*'MlpPolicy'"):
        IPPO("CnnPolicy", simple_spread_v3.parallel_env(N=2, max_cycles=5))


def test_an_observation_space_sb3_cannot_take_names_the_agent_and_what_is_supported() -> None:
    env = DyingAgentsEnv()
    env.observation_spaces = {agent: spaces.Tuple((spaces.Discrete(2), spaces.Discrete(3))) for agent in env.possible_agents}
    with pytest.raises(ValueError, match=r"Agent 'agent_0' has the observation space Tuple\(.*Dict spaces of them"):
        IPPO("MlpPolicy", env)


def test_agent_ids_that_are_not_strings_are_refused_saying_why() -> None:
    env = DyingAgentsEnv()  # ids as PettingZoo allows them: any hashable
    env.possible_agents = [(0, agent) for agent in env.possible_agents]
    env.observation_spaces = {(0, agent): space for agent, space in env.observation_spaces.items()}
    env.action_spaces = {(0, agent): space for agent, space in env.action_spaces.items()}
    with pytest.raises(ValueError, match=r"agent ids \[\(0, 'agent_0'\).*are not strings"):
        IPPO("MlpPolicy", env)


def test_a_scalar_box_observation_space_is_refused_saying_to_give_it_shape_one() -> None:
    env = DyingAgentsEnv()
    env.observation_spaces = {agent: spaces.Box(-1.0, 1.0, shape=()) for agent in env.possible_agents}
    with pytest.raises(ValueError, match=r"Agent 'agent_0' has a Box observation space of shape \(\).*shape \(1,\)"):
        IPPO("MlpPolicy", env)


def test_model_policy_says_there_is_one_policy_per_agent() -> None:
    model = IPPO("MlpPolicy", DyingAgentsEnv())
    with pytest.raises(AttributeError, match=r"one policy per agent.*model\.policies\[agent_id\]"):
        model.policy  # noqa: B018 (SB3's habit)
    assert not hasattr(model, "policy")
