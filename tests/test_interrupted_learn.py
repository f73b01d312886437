"""Interrupted training loses nothing: after Ctrl-C or an exception inside ``learn``, the model predicts, saves,
loads and learns again; the trajectories in progress are dropped and counted in ``episodes_lost``."""

from __future__ import annotations

import os
import pathlib
import signal
from typing import Any

import numpy as np
import pytest
from stable_baselines3.common.callbacks import BaseCallback

from sb3_ippo import IPPO, make_vec_env
from tests.flaky_envs import FlakyEnv
from tests.helpers import (
    assert_same_actions,
    assert_same_parameters,
    assert_unbroken,
    observation_batch,
    parameters,
    record_trajectories,
)


class RaiseAt(BaseCallback):
    """Raises ``error`` at the ``at_step``-th vectorized step, noting the trajectories then in progress."""

    def __init__(self, at_step: int, error: BaseException) -> None:
        super().__init__()
        self.at_step = at_step
        self.error = error
        self.open_trajectories = -1

    def _on_step(self) -> bool:
        if self.n_calls == self.at_step:
            self.open_trajectories = sum(
                trajectory is not None for buffer in self.model.buffers.values() for trajectory in buffer._open
            )
            raise self.error
        return True


def make_model(env: Any) -> IPPO:
    return IPPO("MlpPolicy", env, n_episodes=2, n_epochs=2, policy_kwargs=dict(net_arch=[16]), seed=0)


def assert_consistent(model: IPPO, tmp_path: pathlib.Path) -> None:
    """The model predicts, saves and loads to the same deterministic actions and weights, in both formats."""
    observations = observation_batch(model)
    expected, _ = model.predict(observations, deterministic=True)
    for name in ("model.zip", "model.safetensors"):
        model.save(tmp_path / name)
        loaded = IPPO.load(tmp_path / name)
        assert_same_actions(loaded.predict(observations, deterministic=True)[0], expected)
        assert_same_parameters(parameters(loaded), parameters(model))
        assert loaded.episodes_lost == model.episodes_lost


@pytest.mark.parametrize(
    "error", [KeyboardInterrupt(), ValueError("a callback failed")], ids=["KeyboardInterrupt", "exception"]
)
def test_an_interrupted_learn_leaves_a_consistent_model_that_learns_again(
    error: BaseException, tmp_path: pathlib.Path
) -> None:
    env = make_vec_env(FlakyEnv, n_envs=2, seed=0)
    model = make_model(env)
    drained = record_trajectories(model)
    interrupt = RaiseAt(at_step=9, error=error)  # 3 steps into both copies' second episode, after an update
    with pytest.raises(type(error)):
        model.learn(100, callback=interrupt)
    assert model.policy_version >= 1
    assert interrupt.open_trajectories == 4
    assert model.episodes_lost == 4
    assert all(trajectory is None for buffer in model.buffers.values() for trajectory in buffer._open)
    assert_consistent(model, tmp_path)

    version, timesteps = model.policy_version, model.num_timesteps
    model.learn(36, reset_num_timesteps=False)
    assert model.num_timesteps == timesteps + 36 and model.policy_version > version
    assert model.episodes_lost == 4
    assert_unbroken(drained)


def test_an_env_error_inside_learn_leaves_a_consistent_model(tmp_path: pathlib.Path) -> None:
    env = make_vec_env(lambda: FlakyEnv(fail_at_step=10, only_seeds=(0,)), n_envs=2, seed=0)  # on_env_error="raise"
    model = make_model(env)
    with pytest.raises(RuntimeError, match="FlakyEnv failed on purpose"):
        model.learn(100)
    # Copy 0 raised; copy 1 had not stepped yet: both copies' trajectories in progress (3 steps each) are dropped.
    assert model.episodes_lost == 4
    assert_consistent(model, tmp_path)
    model.learn(24, reset_num_timesteps=False)  # the copies are reset; the envs fail no more


@pytest.mark.usefixtures("no_hang")
def test_ctrl_c_while_waiting_for_worker_processes_leaves_the_env_usable() -> None:
    # Copy 0's worker sends SIGINT to this process during its second step, before it replies: Ctrl-C strikes while
    # the parent waits for both workers, whatever the machine's load.
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler, "an earlier test changed the Ctrl-C handler"
    pid = os.getpid()
    env = make_vec_env(
        lambda: FlakyEnv(fail_at_step=2, how="interrupt", interrupt_pid=pid, only_seeds=(0,), step_seconds=0.1),
        n_envs=2,
        seed=0,
        vec_env_cls="subproc",
    )
    model = make_model(env)
    with pytest.raises(KeyboardInterrupt):
        model.learn(100)
    assert model.num_timesteps == 2
    assert sum(env._awaiting) == 2, "the interrupted step's replies are still owed"
    assert all(process.is_alive() for process in env.processes), "the workers ignore Ctrl-C"
    model.learn(2, reset_num_timesteps=False)  # the owed replies are read and discarded, the copies reset
    assert model.num_timesteps == 4
    obs = model.env.reset()
    assert np.all(obs["agent_0"][:, 0] == 0.0)
    env.close()
