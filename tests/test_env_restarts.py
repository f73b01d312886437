"""Env failures survived: ``make_vec_env(..., on_env_error="restart", max_restarts=...)`` and IPPO's counts."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from stable_baselines3.common.callbacks import BaseCallback

from sb3_ippo import IPPO, make_vec_env
from sb3_ippo.vec_env.subproc import SubprocMultiAgentVecEnv
from sb3_ippo.vec_env import MultiAgentStep, MultiAgentVecEnv
from tests.flaky_envs import FlakyEnv
from tests.helpers import FLAKY_MAX_STEPS, assert_unbroken, episode_steps, record_logs, record_trajectories

VEC_ENV_CLASSES = ["dummy", "subproc"]


def zeros(vec_env: MultiAgentVecEnv) -> dict[str, np.ndarray]:
    return {agent: np.zeros(vec_env.num_envs, dtype=np.int64) for agent in vec_env.possible_agents}


def flaky(**kwargs: Any) -> Callable[[], FlakyEnv]:
    return lambda: FlakyEnv(**kwargs)


# --- The env layer ----------------------------------------------------------------------------------------------


@pytest.mark.usefixtures("no_hang")
@pytest.mark.parametrize("vec_env_cls", VEC_ENV_CLASSES)
def test_a_copy_that_raises_in_step_is_rebuilt_and_reported(vec_env_cls: str) -> None:
    # Copy 1 fails at its 4th step (mid-episode: episodes last 6); copy 0 never does.
    vec_env = make_vec_env(
        flaky(fail_at_step=4, only_seeds=(11,)), n_envs=2, seed=10, vec_env_cls=vec_env_cls, on_env_error="restart"
    )
    vec_env.reset()
    steps = [vec_env.step_agents(zeros(vec_env)) for _ in range(4)]
    last = steps[-1]
    assert isinstance(last, MultiAgentStep) and last.restarted is not None
    assert last.restarted.tolist() == [False, True]
    assert last.dones.tolist() == [False, True]
    assert last.infos[1]["env_restarted"] is True and "episode" not in last.infos[1]
    assert "FlakyEnv failed on purpose in step call 4" in last.infos[1]["env_error"]
    assert "env_restarted" not in last.infos[0]
    for agent in vec_env.possible_agents:
        # The rebuilt copy starts a new episode; its rewards and flags in the failed step are no transitions.
        assert episode_steps(last.obs[agent]).tolist() == [4, 0]
        assert last.alive[agent].tolist() == [True, True]
        assert last.rewards[agent][1] == 0 and not last.terminations[agent][1] and not last.truncations[agent][1]
    assert not any(step.restarted.any() for step in steps[:-1])
    assert vec_env.restarts == 1
    # Reseeded: seed + i + k * n_envs for the k-th restart of copy i.
    assert vec_env.get_attr("reset_seeds", indices=[1]) == [[10 + 1 + 1 * 2]]
    vec_env.step_agents(zeros(vec_env))  # and it goes on
    vec_env.close()


@pytest.mark.usefixtures("no_hang")
@pytest.mark.parametrize("vec_env_cls", VEC_ENV_CLASSES)
def test_on_env_error_raise_is_the_default_and_carries_the_envs_traceback(vec_env_cls: str) -> None:
    vec_env = make_vec_env(flaky(fail_at_step=2), n_envs=2, vec_env_cls=vec_env_cls)
    vec_env.reset()
    vec_env.step_agents(zeros(vec_env))
    with pytest.raises(RuntimeError, match=r"(?s)env copy 0 raised in step.*Traceback.*FlakyEnv failed on purpose.*restart"):
        vec_env.step_agents(zeros(vec_env))


@pytest.mark.usefixtures("no_hang")
@pytest.mark.parametrize("vec_env_cls", VEC_ENV_CLASSES)
def test_one_failure_more_than_max_restarts_raises(vec_env_cls: str) -> None:
    vec_env = make_vec_env(
        flaky(fail_at_step=2, fail_every=2), n_envs=1, vec_env_cls=vec_env_cls, on_env_error="restart", max_restarts=2
    )
    vec_env.reset()
    restarted = []
    with pytest.raises(RuntimeError, match=r"(?s)restarted 2 times already.*max_restarts=2"):
        for _ in range(20):
            restarted.append(bool(vec_env.step_agents(zeros(vec_env)).restarted[0]))
    assert restarted == [False, True, False, True, False]  # each rebuilt env fails at its own 2nd step
    assert vec_env.restarts == 2


@pytest.mark.usefixtures("no_hang")
@pytest.mark.parametrize("vec_env_cls", VEC_ENV_CLASSES)
def test_a_reset_that_fails_after_a_finished_episode_loses_nothing(vec_env_cls: str) -> None:
    # reset call 1 is the first reset; call 2 is the automatic one after the first episode.
    vec_env = make_vec_env(flaky(fail_at_reset=2), n_envs=1, vec_env_cls=vec_env_cls, on_env_error="restart")
    vec_env.reset()
    for _ in range(FLAKY_MAX_STEPS - 1):
        vec_env.step_agents(zeros(vec_env))
    end = vec_env.step_agents(zeros(vec_env))
    assert end.dones[0] and not end.restarted[0]
    assert end.infos[0]["env_restarted"] and "FlakyEnv failed on purpose in reset call 2" in end.infos[0]["env_error"]
    assert end.infos[0]["episode"]["l"] == FLAKY_MAX_STEPS
    assert all(end.truncations[agent][0] for agent in vec_env.possible_agents)
    assert episode_steps(end.obs["agent_0"]).tolist() == [0]
    assert vec_env.restarts == 1


@pytest.mark.usefixtures("no_hang")
@pytest.mark.parametrize("vec_env_cls", VEC_ENV_CLASSES)
def test_a_copy_whose_first_reset_fails_is_rebuilt(vec_env_cls: str) -> None:
    vec_env = make_vec_env(
        flaky(fail_at_reset=1, only_seeds=(3, 4)), n_envs=2, seed=3, vec_env_cls=vec_env_cls, on_env_error="restart"
    )
    obs = vec_env.reset()
    assert episode_steps(obs["agent_0"]).tolist() == [0, 0]
    assert vec_env.restarts == 2
    assert all(info["env_restarted"] for info in vec_env.reset_infos)


@pytest.mark.usefixtures("no_hang")
def test_a_dead_worker_is_started_anew_and_its_copies_rebuilt() -> None:
    vec_env = make_vec_env(FlakyEnv, n_envs=2, seed=0, vec_env_cls="subproc", on_env_error="restart")
    assert isinstance(vec_env, SubprocMultiAgentVecEnv) and len(vec_env.processes) == 2
    vec_env.reset()
    vec_env.step_agents(zeros(vec_env))
    old = vec_env.processes[0]
    os.kill(old.pid, signal.SIGKILL)
    old.join()
    step = vec_env.step_agents(zeros(vec_env))
    assert step.restarted.tolist() == [True, False]
    assert "worker 0 (env copies [0])" in step.infos[0]["env_error"]
    assert episode_steps(step.obs["agent_0"]).tolist() == [0, 2]
    assert vec_env.processes[0] is not old and vec_env.processes[0].is_alive()
    assert vec_env.restarts == 1
    vec_env.step_agents(zeros(vec_env))
    vec_env.close()
    assert [process.exitcode for process in vec_env.processes] == [0, 0]


@pytest.mark.usefixtures("no_hang")
def test_a_worker_that_dies_before_a_reset_is_replaced_by_the_reset() -> None:
    vec_env = make_vec_env(FlakyEnv, n_envs=2, seed=0, vec_env_cls="subproc", on_env_error="restart")
    assert isinstance(vec_env, SubprocMultiAgentVecEnv)
    vec_env.reset()
    os.kill(vec_env.processes[1].pid, signal.SIGKILL)
    vec_env.processes[1].join()
    obs = vec_env.reset()
    assert episode_steps(obs["agent_0"]).tolist() == [0, 0]
    assert [bool(info.get("env_restarted")) for info in vec_env.reset_infos] == [False, True]
    assert vec_env.restarts == 1
    vec_env.step_agents(zeros(vec_env))
    vec_env.close()


@pytest.mark.parametrize(
    ("on_env_error", "max_restarts", "message"),
    [("retry", 3, "on_env_error must be one of"), ("restart", -1, "max_restarts must be a non-negative integer")],
)
def test_bad_restart_settings_are_refused(on_env_error: str, max_restarts: int, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make_vec_env(FlakyEnv, on_env_error=on_env_error, max_restarts=max_restarts)


# --- IPPO ---------------------------------------------------------------------------------------------------------


class KillWorker(BaseCallback):
    """SIGKILLs worker 0 at the ``at_step``-th vectorized step, noting the trajectories then in progress in its copy."""

    def __init__(self, at_step: int) -> None:
        super().__init__()
        self.at_step = at_step
        self.open_in_copy_0 = -1

    def _on_step(self) -> bool:
        if self.n_calls == self.at_step:
            self.open_in_copy_0 = sum(buffer._open[0] is not None for buffer in self.model.buffers.values())
            process = self.model.env.processes[0]
            os.kill(process.pid, signal.SIGKILL)
            process.join()
        return True


@pytest.mark.usefixtures("no_hang")
def test_training_survives_a_worker_killed_mid_episode_with_the_right_counts() -> None:
    env = make_vec_env(FlakyEnv, n_envs=2, seed=0, vec_env_cls="subproc", on_env_error="restart")
    model = IPPO("MlpPolicy", env, n_episodes=2, n_epochs=2, policy_kwargs=dict(net_arch=[16]), seed=0)
    output = record_logs(model)
    drained = record_trajectories(model)
    kill = KillWorker(at_step=9)  # step 9: 3 steps into both copies' second episode
    model.learn(60, callback=kill)
    env.close()
    assert model.num_timesteps == 60 and model.policy_version >= 2
    assert kill.open_in_copy_0 == 2
    assert model.env_restarts == 1
    assert model.episodes_lost == 2
    assert_unbroken(drained)
    logged = [dump for dump in output.dumps if "rollout/env_restarts" in dump]
    assert logged[-1]["rollout/env_restarts"] == 1 and logged[-1]["rollout/episodes_lost"] == 2


@pytest.mark.parametrize("rollout_len", [None, 4])
def test_training_survives_an_env_that_raises_on_its_kth_step(rollout_len: int | None) -> None:
    # Copy 0 (seeded 0) raises in its 11th step call, after 4 steps of its second episode; rebuilt, it is reseeded
    # and runs on.
    env = make_vec_env(flaky(fail_at_step=11, only_seeds=(0,)), n_envs=2, seed=0, on_env_error="restart")
    model = IPPO(
        "MlpPolicy", env, n_episodes=2, n_epochs=2, policy_kwargs=dict(net_arch=[16]), seed=0, rollout_len=rollout_len
    )
    drained = record_trajectories(model)
    model.learn(30)
    assert model.env_restarts == env.restarts == 1
    # Both agents' trajectories in progress in copy 0: its 4 steps of the second episode, or with rollout_len=4 the
    # last 2 of them (copy 0's count reached 8, a cut, 2 steps into that episode).
    assert model.episodes_lost == 2
    for trajectory in drained:
        steps = episode_steps(trajectory.observations)
        assert steps.tolist() == list(range(steps[0], steps[0] + len(trajectory)))
        if rollout_len is None:
            assert steps[0] == 0
