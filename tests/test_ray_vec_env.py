"""``make_vec_env(..., vec_env_cls="ray")``: the same contract as "subproc" (the checks of ``helpers.py`` that
``test_vec_env.py`` runs on "dummy" and "subproc" run on it), with the copies in Ray actors. One local Ray instance
serves the module."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import numpy as np
import pytest

from sb3_ippo import IPPO, make_vec_env
from tests.envs import CrashingEnv, DyingAgentsEnv
from tests.helpers import (
    SAME_DATA_ENVS,
    assert_env_method_calls_the_chosen_copies,
    assert_get_attr_reads_each_copys_attribute,
    assert_max_episode_steps_truncates_every_episode,
    assert_same,
    assert_set_attr_changes_only_the_chosen_copies,
    closing,
    fail_after,
    rollout,
)

ray = pytest.importorskip("ray")


@pytest.fixture(scope="module", autouse=True)
def local_ray() -> Iterator[None]:
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


@pytest.fixture
def no_hang() -> Iterator[None]:
    # Longer than test_vec_env's 30 s: each Ray actor is a fresh interpreter importing torch, which on a loaded
    # 2-core machine took more than 30 s for two of them (the alarm then fired inside ray.get).
    with fail_after(120):
        yield


def test_ray_is_imported_only_when_asked_for() -> None:
    # The library itself never imports Ray: a fresh interpreter importing sb3_ippo and making a dummy env has no `ray`.
    code = "import sys, sb3_ippo, tests.envs; sb3_ippo.make_vec_env(tests.envs.DyingAgentsEnv); print('ray' in sys.modules)"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert run.stdout.strip() == "False"


@pytest.mark.parametrize(
    "env_name",
    [
        "dying_and_joining",
        pytest.param("variable_length", marks=pytest.mark.slow),
        pytest.param("simple_spread", marks=pytest.mark.slow),
    ],
)
def test_ray_gives_the_same_data_as_dummy(env_name: str) -> None:
    # Auto-reset, alive masks, final observations and seeding: step for step the data of the in-process copies.
    env_fn, env_kwargs = SAME_DATA_ENVS[env_name]
    data = {}
    for vec_env_cls in ("dummy", "ray"):
        vec_env = make_vec_env(env_fn, n_envs=3, seed=1, vec_env_cls=vec_env_cls, env_kwargs=env_kwargs, n_workers=2)
        with closing(vec_env):
            data[vec_env_cls] = rollout(vec_env, 10)
    assert_same(data["ray"], data["dummy"])


@pytest.mark.slow
def test_max_episode_steps_truncates_every_episode() -> None:
    assert_max_episode_steps_truncates_every_episode("ray")


@pytest.mark.slow
def test_get_attr_set_attr_and_env_method() -> None:
    assert_get_attr_reads_each_copys_attribute("ray")
    assert_set_attr_changes_only_the_chosen_copies("ray")
    assert_env_method_calls_the_chosen_copies("ray")


@pytest.mark.usefixtures("no_hang")
@pytest.mark.parametrize(
    ("how", "message"),
    [pytest.param("raise", "crashed on purpose at step 2", marks=pytest.mark.slow), ("exit", r"worker \d .*died")],
    ids=["raises", "exits"],
)
def test_a_crashing_env_or_a_dead_actor_raises_in_the_parent(how: str, message: str) -> None:
    vec_env = make_vec_env(CrashingEnv, n_envs=2, vec_env_cls="ray", env_kwargs={"how": how}, n_workers=2)
    vec_env.reset()
    actions = {agent: np.zeros(2, dtype=np.int64) for agent in vec_env.possible_agents}
    vec_env.step_agents(actions)
    with pytest.raises(RuntimeError, match=f"(?s)RayMultiAgentVecEnv: .*{message}"):
        vec_env.step_agents(actions)
    assert vec_env.closed
    with pytest.raises(RuntimeError, match="RayMultiAgentVecEnv: the env is closed"):
        vec_env.step_agents(actions)


@pytest.mark.slow
@pytest.mark.usefixtures("no_hang")
def test_a_dead_actor_is_replaced_with_on_env_error_restart() -> None:
    with closing(make_vec_env(CrashingEnv, n_envs=2, seed=0, vec_env_cls="ray", env_kwargs={"how": "exit"}, n_workers=2,
                              on_env_error="restart")) as vec_env:
        vec_env.reset()
        actions = {agent: np.zeros(2, dtype=np.int64) for agent in vec_env.possible_agents}
        vec_env.step_agents(actions)
        step = vec_env.step_agents(actions)  # both actors die at step 2 and are started anew
        assert step.restarted is not None and step.restarted.all()
        assert [info.get("env_restarted") for info in step.infos] == [True, True]


@pytest.mark.slow
def test_ippo_learns_on_ray_copies() -> None:
    vec_env = make_vec_env(DyingAgentsEnv, n_envs=2, seed=0, vec_env_cls="ray")
    model = IPPO("MlpPolicy", vec_env, n_episodes=2, n_epochs=2, policy_kwargs=dict(net_arch=[16]), seed=0)
    model.learn(3 * 12)
    vec_env.close()
    assert model.policy_version == 3


