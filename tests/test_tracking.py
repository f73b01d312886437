"""Weights & Biases: wandb's SB3 callback with IPPO.learn, sb3_ippo.tracking.WandbCallback's gradients over every
agent's networks, and train --wandb-project; every run offline (WANDB_MODE=offline: no server, no network), read
back from the files it wrote."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from mpe2 import simple_spread_v3

from sb3_ippo import IPPO, make_vec_env
from tests.test_cli import QUICK, hide, usage_error
from tests.wandb_records import read_offline_run

ROOT = pathlib.Path(__file__).resolve().parent.parent

wandb = pytest.importorskip("wandb")
pytest.importorskip("tensorboard")

TINY: dict[str, Any] = dict(n_episodes=2, n_epochs=2, policy_kwargs=dict(net_arch=[16]), seed=0)
PER_AGENT_KEYS = {"rollout/agent_0/ep_rew_mean", "rollout/agent_1/ep_rew_mean", "train/agent_0/policy_loss"}


@pytest.fixture(autouse=True)
def offline(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    for name in ("WANDB_DIR", "WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(name, str(tmp_path / "wandb_home"))
    monkeypatch.chdir(tmp_path)
    yield
    # wandb.init(sync_tensorboard=True) patches TensorBoard once per process, for the folders of that run.
    wandb.tensorboard.unpatch()


def spread() -> Any:
    return make_vec_env(simple_spread_v3.parallel_env, n_envs=2, seed=0, env_kwargs=dict(N=2, max_cycles=10))


def test_wandbs_own_sb3_callback_logs_per_agent_metrics_and_saves_the_model(tmp_path: pathlib.Path) -> None:
    from wandb.integration.sb3 import WandbCallback

    # The first wandb run of this process with sync_tensorboard (wandb syncs TensorBoard for that one only).
    run = wandb.init(project="sb3_ippo-tests", dir=str(tmp_path), sync_tensorboard=True)
    model = IPPO("MlpPolicy", spread(), tensorboard_log=str(tmp_path / "tb" / run.id), **TINY)
    model.learn(200, callback=WandbCallback(model_save_path=str(tmp_path / "models"), verbose=2))
    run.finish()
    logged = read_offline_run(tmp_path / "wandb")
    assert PER_AGENT_KEYS <= logged.history_keys and "rollout/ep_rew_mean" in logged.history_keys
    assert "model.zip" in logged.files and "n_episodes" in logged.config_keys
    saved = IPPO.load(tmp_path / "models" / "model.zip")
    assert saved.num_timesteps == model.num_timesteps and set(saved.policies) == {"agent_0", "agent_1"}


def test_gradient_save_freq_logs_the_gradients_of_every_agents_network(tmp_path: pathlib.Path) -> None:
    from sb3_ippo.tracking import WandbCallback

    run = wandb.init(project="sb3_ippo-tests", dir=str(tmp_path))
    model = IPPO("MlpPolicy", spread(), batched=False, async_training=False, **TINY)
    model.learn(200, callback=WandbCallback(gradient_save_freq=1))
    run.finish()
    logged = read_offline_run(tmp_path / "wandb")
    # A histogram is logged as nested keys: gradients/<network prefix><parameter>/{bins,values,_type}.
    histograms = {key.rsplit("/", 1)[0] for key in logged.history_keys if "value_net.weight/" in key}
    gradients = {key for key in histograms if key.startswith("gradients/")}
    parameters = {key for key in histograms if key.startswith("parameters/")}
    assert len(gradients) == 2 and len(parameters) == 2  # one of each per agent's network (log="all")
    assert "watched_networks" in logged.config_keys


def test_gradient_save_freq_where_the_update_does_not_use_the_agents_networks_says_what_to_do(
    tmp_path: pathlib.Path,
) -> None:
    from sb3_ippo.tracking import WandbCallback

    run = wandb.init(project="sb3_ippo-tests", dir=str(tmp_path))
    try:
        stacked = "batched=True updates through a path whose backward passes .* group 'agent' \\(agent_0, agent_1\\)"
        for settings, reason in [({"batched": True}, stacked),
                                 ({"async_training": True}, "async_training=True")]:
            model = IPPO("MlpPolicy", spread(), **{"batched": False, "async_training": False, **settings}, **TINY)
            with pytest.raises(ValueError, match=rf"cannot log this model's gradients: {reason}.*batched=False and "):
                model.learn(200, callback=WandbCallback(gradient_save_freq=1))
    finally:
        run.finish()


@pytest.mark.parametrize(
    ("settings", "networks"),
    [({"share_parameters": True}, 1), ({"groups": {"first": ["agent_0"], "second": ["agent_1"]}}, 2)],
    ids=["shared network", "groups of one agent"],
)
def test_batched_true_logs_the_gradients_of_networks_it_does_not_stack(
    tmp_path: pathlib.Path, settings: dict[str, Any], networks: int
) -> None:
    from sb3_ippo.tracking import WandbCallback

    run = wandb.init(project="sb3_ippo-tests", dir=str(tmp_path))
    model = IPPO("MlpPolicy", spread(), batched=True, async_training=False, **settings, **TINY)
    model.learn(200, callback=WandbCallback(gradient_save_freq=1, log="gradients"))
    run.finish()
    logged = read_offline_run(tmp_path / "wandb")
    assert len({key.rsplit("/", 1)[0] for key in logged.history_keys if "value_net.weight/" in key}) == networks


def test_gradient_save_freq_with_a_shared_network_watches_it_once(tmp_path: pathlib.Path) -> None:
    from sb3_ippo.tracking import WandbCallback

    run = wandb.init(project="sb3_ippo-tests", dir=str(tmp_path))
    model = IPPO("MlpPolicy", spread(), share_parameters=True, batched=False, async_training=False, **TINY)
    model.learn(200, callback=WandbCallback(gradient_save_freq=1, log="gradients"))
    run.finish()
    logged = read_offline_run(tmp_path / "wandb")
    assert len({key.rsplit("/", 1)[0] for key in logged.history_keys if "value_net.weight/" in key}) == 1


def test_wandbs_own_callback_with_gradient_save_freq_names_the_callback_that_watches_every_agent(
    tmp_path: pathlib.Path,
) -> None:
    from wandb.integration.sb3 import WandbCallback

    run = wandb.init(project="sb3_ippo-tests", dir=str(tmp_path))
    try:
        with pytest.raises(AttributeError, match=r"one policy per agent.*use sb3_ippo\.tracking\.WandbCallback"):
            IPPO("MlpPolicy", spread(), **TINY).learn(200, callback=WandbCallback(gradient_save_freq=1))
    finally:
        run.finish()


def test_train_wandb_project_logs_every_key_and_uploads_the_run_files(tmp_path: pathlib.Path) -> None:
    # In its own process, as a user runs it: wandb syncs TensorBoard's events only for the first run of a process
    # that writes them (the wandb runs of the tests above came first).
    out = tmp_path / "run"
    command = [sys.executable, "-m", "sb3_ippo", "train", "--out", str(out), *QUICK, "--wandb-project", "sb3_ippo-tests"]
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    finished = subprocess.run(command, capture_output=True, text=True, env=environment, timeout=600, check=False)
    assert finished.returncode == 0, finished.stderr
    logged = read_offline_run(out / "wandb")
    assert {"rollout/agent_0/ep_rew_mean", "train/agent_1/policy_loss", "train/policy_version"} <= logged.history_keys
    assert {"model.zip", "run.json", "progress.csv"} <= logged.files
    assert {"hyperparameters", "env", "command"} <= logged.config_keys  # run.json
    assert "Logged to Weights & Biases: project sb3_ippo-tests, run run" in finished.stdout


def test_train_wandb_project_without_wandb_says_what_to_install(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    hide(monkeypatch, "wandb")
    err = usage_error(capsys, ["train", "--out", str(tmp_path / "run"), "--wandb-project", "p"])
    assert "argument --wandb-project: Weights & Biases tracking needs wandb and tensorboard: pip install" in err
