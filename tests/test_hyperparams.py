"""The tuned settings that ship in the package (``sb3_ippo/hyperparams/ippo.yml``) and ``tuned_hyperparameters``."""

from __future__ import annotations

import pathlib
from typing import Any

import pytest
from pettingzoo.classic import connect_four_v3, tictactoe_v3
from stable_baselines3.common.utils import LinearSchedule
from torch import nn

from sb3_ippo import IPPO, make_vec_env, tuned_hyperparameters
from sb3_ippo.hyperparams import TUNED_FILE, read_hyperparams_file

pytestmark = pytest.mark.filterwarnings("ignore:The old environment creation API:DeprecationWarning")

# The command line's per-game settings as cli/settings.py wrote them in Python before they became data.
GAME_DEFAULTS: dict[str, Any] = {
    "share_parameters": True,
    "self_play_pool": {"snapshot_every": 10, "size": 20},
    "n_steps": 512,
    "n_episodes": None,
    "batch_size": 128,
    "n_epochs": 10,
    "learning_rate": "lin_1e-3",
    "ent_coef": 0.01,
    "policy_kwargs": {"net_arch": [256, 256], "activation_fn": nn.ReLU},
}
ENV_DEFAULTS: dict[str, dict[str, Any]] = {
    "pettingzoo.classic.tictactoe_v3": {**GAME_DEFAULTS, "n_steps": 1024, "batch_size": 256},
    "pettingzoo.classic.connect_four_v3": GAME_DEFAULTS,
}


@pytest.mark.parametrize("env_id", list(ENV_DEFAULTS))
def test_the_packaged_file_holds_the_game_settings_the_command_line_had(env_id: str) -> None:
    assert read_hyperparams_file(TUNED_FILE, env_id) == ENV_DEFAULTS[env_id]


def assert_tuned_for_tictactoe(hyperparameters: dict[str, Any]) -> None:
    """The tictactoe settings as IPPO takes them: the schedule an SB3 schedule, the activation a torch class."""
    expected = {**ENV_DEFAULTS["pettingzoo.classic.tictactoe_v3"]}
    learning_rate = hyperparameters.pop("learning_rate")
    del expected["learning_rate"]
    assert hyperparameters == expected
    assert isinstance(learning_rate, LinearSchedule)
    assert learning_rate(1.0) == pytest.approx(1e-3) and learning_rate(0.5) == pytest.approx(5e-4)
    assert learning_rate(0.0) == 0.0


@pytest.mark.parametrize("env", ["pettingzoo.classic.tictactoe_v3", "tictactoe_v3", tictactoe_v3])
def test_tuned_hyperparameters_by_env_id_or_module(env: Any) -> None:
    assert_tuned_for_tictactoe(tuned_hyperparameters(env))


def test_tuned_hyperparameters_by_env_object_go_by_its_metadata_name() -> None:
    assert_tuned_for_tictactoe(tuned_hyperparameters(tictactoe_v3.env()))  # wrapped by PettingZoo, named tictactoe_v3
    vec_env = make_vec_env(tictactoe_v3.env, n_envs=2)
    assert_tuned_for_tictactoe(tuned_hyperparameters(vec_env))  # its copies' name
    vec_env.close()
    assert tuned_hyperparameters(connect_four_v3.env())["n_steps"] == 512


def test_an_env_without_tuned_settings_gets_none_so_ippo_keeps_its_defaults() -> None:
    assert tuned_hyperparameters("mpe2.simple_spread_v3") == {}


def test_an_env_with_no_name_asks_for_its_id() -> None:
    with pytest.raises(TypeError, match="Pass the env id instead"):
        tuned_hyperparameters(object())


def test_each_call_gives_a_new_dict() -> None:
    tuned_hyperparameters("tictactoe_v3")["policy_kwargs"]["net_arch"].append(1)
    assert tuned_hyperparameters("tictactoe_v3")["policy_kwargs"]["net_arch"] == [256, 256]


def test_a_file_of_your_own_gives_only_ippo_arguments(tmp_path: pathlib.Path) -> None:
    file = tmp_path / "ippo.yml"
    file.write_text(
        "simple_spread_v3:\n  n_timesteps: !!float 1e6\n  n_envs: 4\n  policy: MlpPolicy\n  n_epochs: 20\n  gamma: 0.95\n"
    )
    assert tuned_hyperparameters("mpe2.simple_spread_v3", file=file) == {"n_epochs": 20, "gamma": 0.95}
    with pytest.raises(ValueError, match="has no section for pistonball_v6"):
        tuned_hyperparameters("pistonball_v6", file=file)


def test_ippo_builds_and_learns_with_the_tuned_settings() -> None:
    env = tictactoe_v3.env()
    # Smaller batches than tuned, so that a few hundred moves make updates.
    model = IPPO("MultiInputPolicy", env, **{**tuned_hyperparameters(env), "n_steps": 64, "batch_size": 32}, seed=0)
    model.learn(600)
    assert model.policy_version >= 1 and model.share_parameters is True
    assert model.policy_kwargs["activation_fn"] is nn.ReLU and model.lr_schedule(1.0) == pytest.approx(1e-3)


def test_sisl_sections_share_one_network_and_pursuit_takes_the_peers_settings() -> None:
    # Issue 32's 3-seed figures (ippo.yml's comment, docs/benchmarks.md): multiwalker the defaults with one shared
    # network; pursuit that with the peer's rollouts and value targets (benchmarks/learning.py's ippo_as_peer_sync).
    assert tuned_hyperparameters("pettingzoo.sisl.multiwalker_v9") == {"share_parameters": True}
    as_peer = {
        "share_parameters": True, "rollout_len": 256, "align_rollouts": False, "normalize_returns": False,
        "time_limit_bootstrap": False,
    }
    assert tuned_hyperparameters("pettingzoo.sisl.pursuit_v5") == as_peer
    assert tuned_hyperparameters("pursuit_v5") == as_peer
