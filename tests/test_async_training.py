"""``async_training``: each update runs in a learner process while collection goes on with the previous version (the
reference's background training, docs/algorithm.md). On :class:`DyingAgentsEnv` (see ``test_run.py``) one copy gives
one 2-, 4- and 6-step trajectory per episode of 6 env steps, so with ``n_episodes=2`` an update is due every 12 env
steps (one copy: two episodes; two copies: one episode each) and no trajectory is left over.

Starting a learner costs a second or two (a fresh interpreter imports torch), so one async run
(:func:`async_run`) serves several tests.
"""

from __future__ import annotations

import multiprocessing
import os
import pathlib
import pickle
import signal
import subprocess
import sys
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
import torch as th
from stable_baselines3.common.callbacks import BaseCallback

import sb3_ippo.common.on_policy_algorithm as on_policy_algorithm
import sb3_ippo.update.learner as learner_module
from sb3_ippo import IPPO, make_vec_env
from sb3_ippo.update.trainer import UpdateJob
from sb3_ippo.update.learner import guards_main
from tests.envs import DyingAgentsEnv
from tests.helpers import (
    EPISODE_LENGTH,
    RecordingOutput,
    assert_same_parameters,
    make_model,
    parameters,
    record_logs,
    stacked_groups,
)
from tests.learner_faults import FailsInLearnerPolicy

STEPS_PER_UPDATE = 2 * EPISODE_LENGTH
N_UPDATES = 5
# With a learner that hangs or dies, learn must end well within this (the test fails rather than hangs).
DEADLINE_SECONDS = 60


@pytest.fixture
def deadline() -> Iterator[None]:
    def too_slow(signum: int, frame: Any) -> None:
        raise TimeoutError(f"learn did not end within {DEADLINE_SECONDS} s")

    previous = signal.signal(signal.SIGALRM, too_slow)
    signal.alarm(DEADLINE_SECONDS)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


def assert_no_learner_left(model: IPPO, pid: int | None) -> None:
    assert model._learner is None
    assert multiprocessing.active_children() == []
    if pid is not None:
        assert not pathlib.Path(f"/proc/{pid}").exists(), f"learner process {pid} outlived learn"


def async_model(**kwargs: Any) -> IPPO:
    params: dict[str, Any] = dict(async_training=True, shuffle_minibatches=True, normalize_obs=True)
    params.update(kwargs)
    return make_model(make_vec_env(DyingAgentsEnv, n_envs=2), **params)


class Watcher(BaseCallback):
    """Records, at every env step, the policy version and the weights; saves the model once while an update is in
    flight; remembers the learner's pid."""

    def __init__(self, save_path: pathlib.Path) -> None:
        super().__init__()
        self.save_path = save_path
        self.steps: list[tuple[int, dict[str, dict[str, th.Tensor]]]] = []
        self.saved: tuple[int, dict[str, dict[str, th.Tensor]]] | None = None
        self.learner_pids: set[int] = set()
        self.learner_processes: list[Any] = []

    def _on_step(self) -> bool:
        self.steps.append((self.model.policy_version, parameters(self.model)))
        if self.model._learner is not None:
            self.learner_pids.add(self.model._learner.process.pid)
            if not self.learner_processes:
                self.learner_processes.append(self.model._learner.process)
        if self.model._update_in_flight is not None and self.saved is None:
            self.model.save(self.save_path)
            self.saved = self.steps[-1]
        return True


@dataclass
class AsyncRun:
    model: IPPO
    watcher: Watcher
    output: RecordingOutput
    jobs: list[tuple[int, dict[str, list[int]]]] = field(default_factory=list)


@pytest.fixture(scope="module")
def async_run(tmp_path_factory: pytest.TempPathFactory) -> AsyncRun:
    """One seeded async run of N_UPDATES updates on two copies, watched at every step."""
    model = async_model()
    run = AsyncRun(model, Watcher(tmp_path_factory.mktemp("async") / "model.zip"), record_logs(model))
    prepare = IPPO._prepare_update

    def spy(self: IPPO) -> UpdateJob:
        job = prepare(self)
        versions = {agent: [t.policy_version for t in trajectories] for agent, trajectories in job.trajectories.items()}
        run.jobs.append((self.policy_version, versions))
        return job

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(IPPO, "_prepare_update", spy)
        model.learn(N_UPDATES * STEPS_PER_UPDATE, callback=run.watcher)
    return run


def test_every_batch_after_the_first_was_collected_by_the_previous_version(async_run: AsyncRun) -> None:
    assert async_run.model.policy_version == N_UPDATES
    assert async_run.model.stale_episodes_dropped == 0
    assert len(async_run.jobs) == N_UPDATES
    assert async_run.jobs[0] == (0, {agent: [0, 0] for agent in ("agent_0", "agent_1", "agent_2")})
    for version, trajectory_versions in async_run.jobs[1:]:
        # Drained when `version` is current, the batch was collected while `version - 1` acted.
        assert all(versions == [version - 1, version - 1] for versions in trajectory_versions.values()), version


def test_collection_goes_on_with_unchanged_policies_while_the_update_runs(async_run: AsyncRun) -> None:
    by_version: dict[int, dict[str, dict[str, th.Tensor]]] = {}
    for version, weights in async_run.watcher.steps:
        first = by_version.setdefault(version, weights)
        assert_same_parameters(first, weights)  # weights change only when a version is applied
    # The last update is submitted at the last step and applied when learn ends: the one before is never acted with.
    assert sorted(by_version) == list(range(N_UPDATES - 1))
    assert any(not th.equal(by_version[0]["agent_0"][name], p) for name, p in by_version[1]["agent_0"].items())


def test_one_learner_process_serves_every_update_and_is_gone_after_learn(async_run: AsyncRun) -> None:
    assert len(async_run.watcher.learner_pids) == 1
    assert stacked_groups(async_run.model)  # the agents form one stacked group: the batched update runs in the learner
    assert async_run.watcher.learner_processes[0].exitcode == 0  # it ended when asked, not terminated
    assert_no_learner_left(async_run.model, async_run.watcher.learner_pids.pop())


def test_a_result_installs_the_trained_weights_and_adam_states_exactly() -> None:
    # What the learner sends back, through pickle, makes another copy of the model the trained one.
    trained, copy = make_model(), make_model()
    trained.learn(STEPS_PER_UPDATE)  # Adam has state to send
    trainer = trained._trainer
    stats = {agent: trained.update_stats[agent] for agent in trained.possible_agents}
    result = pickle.loads(pickle.dumps(trainer.result(stats)))
    assert all(isinstance(value, np.ndarray) for state in result.policy_states.values() for value in state.values())
    result.install(copy.policies, copy.return_normalizers)
    assert_same_parameters(parameters(copy), parameters(trained))
    for agent in trained.possible_agents:
        mine, theirs = copy.policies[agent].optimizer.state_dict(), trained.policies[agent].optimizer.state_dict()
        assert mine["param_groups"] == theirs["param_groups"]
        for index, state in theirs["state"].items():
            assert state.keys() == mine["state"][index].keys()
            assert all(th.equal(mine["state"][index][key], value) for key, value in state.items())


def test_the_logger_gets_every_update_once(async_run: AsyncRun) -> None:
    versions = [dump["train/policy_version"] for dump in async_run.output.dumps if "train/policy_version" in dump]
    assert versions == list(range(1, N_UPDATES + 1))
    assert "train/policy_loss" in async_run.output.dumps[-1]


def test_the_first_update_equals_the_synchronous_one(async_run: AsyncRun) -> None:
    # Until the first update is applied, both modes see the same data and start from the same weights.
    sync = async_model(async_training=False)
    sync.learn(STEPS_PER_UPDATE)
    assert sync.policy_version == 1
    first_async = next(weights for version, weights in async_run.watcher.steps if version == 1)
    assert_same_parameters(parameters(sync), first_async)


def test_runs_are_reproducible_with_a_seed(async_run: AsyncRun) -> None:
    again = async_model()
    again.learn(N_UPDATES * STEPS_PER_UPDATE)
    assert_same_parameters(parameters(async_run.model), parameters(again))
    for agent, normalizer in again.return_normalizers.items():  # type: ignore[union-attr]
        theirs = async_run.model.return_normalizers[agent]  # type: ignore[index]
        assert (normalizer.return_rms.mean, normalizer.return_rms.count) == (theirs.return_rms.mean, theirs.return_rms.count)
        assert normalizer.return_rms.count > 1  # the learner's statistics came back


def test_save_while_an_update_runs_keeps_the_applied_version(async_run: AsyncRun) -> None:
    assert async_run.watcher.saved is not None
    version, weights = async_run.watcher.saved
    loaded = IPPO.load(async_run.watcher.save_path, env=make_vec_env(DyingAgentsEnv, n_envs=2))
    assert loaded.policy_version == version == 0
    assert loaded.async_training
    assert_same_parameters(parameters(loaded), weights)
    loaded.learn(2 * STEPS_PER_UPDATE, reset_num_timesteps=False)
    assert loaded.policy_version == 2
    assert_no_learner_left(loaded, None)


def test_shared_parameters_with_subprocess_copies_train_in_the_learner() -> None:
    groups: dict[str, Any] = dict(groups={"pair": ["agent_0", "agent_1"]}, share_parameters={"pair": True})
    sync = make_model(make_vec_env(DyingAgentsEnv, n_envs=2), **groups)
    sync.learn(STEPS_PER_UPDATE)
    first: list[dict[str, dict[str, th.Tensor]]] = []

    class FirstVersion(BaseCallback):
        def _on_step(self) -> bool:
            if self.model.policy_version == 1 and not first:
                first.append(parameters(self.model))
            return True

    # Built (and seeded) after the synchronous run, so that both act on the same random draws.
    model = make_model(make_vec_env(DyingAgentsEnv, n_envs=2, vec_env_cls="subproc"), async_training=True, **groups)
    model.learn(3 * STEPS_PER_UPDATE, callback=FirstVersion())
    model.env.close()  # type: ignore[union-attr]
    assert model.policy_version == 3
    assert model.policies["agent_0"] is model.policies["agent_1"] is not model.policies["agent_2"]
    assert model.return_normalizers["agent_0"] is model.return_normalizers["agent_1"]  # type: ignore[index]
    assert_same_parameters(first[0], parameters(sync))
    assert multiprocessing.active_children() == []


# ----------------------------------------------------------------------------------------------------------------
# Failures and interruptions: a clear error, no hang, no process left, the last applied version kept
# ----------------------------------------------------------------------------------------------------------------


def test_an_error_in_the_learner_reaches_learn_and_the_model_stays_usable(deadline: None, tmp_path: pathlib.Path) -> None:
    model = IPPO(FailsInLearnerPolicy, DyingAgentsEnv(), n_episodes=2, n_epochs=2, policy_kwargs=dict(net_arch=[16]),
                 seed=0, async_training=True, batched=False)
    before = parameters(model)
    pids: list[int] = []

    class LearnerPid(BaseCallback):
        def _on_step(self) -> bool:
            pids.append(self.model._learner.process.pid)
            return True

    with pytest.raises(RuntimeError, match=r"learner process failed in update 1(.|\n)*update failed in the learner"):
        model.learn(3 * STEPS_PER_UPDATE, callback=LearnerPid())
    assert model.policy_version == 0
    assert model._update_in_flight is None
    assert_same_parameters(parameters(model), before)
    assert_no_learner_left(model, pids[-1])
    model.save(tmp_path / "after_error.zip")
    actions, _ = IPPO.load(tmp_path / "after_error.zip").predict({"agent_0": np.zeros(2, dtype=np.float32)})
    assert actions["agent_0"].shape == ()


def test_a_killed_learner_is_a_clear_error_without_a_hang(deadline: None, tmp_path: pathlib.Path) -> None:
    applied: list[dict[str, dict[str, th.Tensor]]] = []
    pids: list[int] = []

    class KillLearner(BaseCallback):
        """Once version 1 is applied and the second update is in flight, kills the learner."""

        def _on_step(self) -> bool:
            if self.model.policy_version == 1 and self.model._update_in_flight is not None and not pids:
                applied.append(parameters(self.model))
                pids.append(self.model._learner.process.pid)
                os.kill(pids[0], signal.SIGKILL)
            return True

    model = async_model()
    start = time.monotonic()
    with pytest.raises(RuntimeError, match=r"learner process \(pid \d+\) died \(exit code -9\) during update 2"):
        model.learn(4 * STEPS_PER_UPDATE, callback=KillLearner())
    assert time.monotonic() - start < 30
    assert model.policy_version == 1
    assert_same_parameters(parameters(model), applied[0])
    assert_no_learner_left(model, pids[0])
    model.save(tmp_path / "after_kill.zip")
    assert IPPO.load(tmp_path / "after_kill.zip").policy_version == 1


class StopDuringUpdate(BaseCallback):
    """Stops learn (``how``) at the first step while an update is in flight."""

    def __init__(self, how: str) -> None:
        super().__init__()
        self.how = how
        self.pid: int | None = None

    def _on_step(self) -> bool:
        if self.model._update_in_flight is None:
            return True
        self.pid = self.model._learner.process.pid
        if self.how == "KeyboardInterrupt":
            raise KeyboardInterrupt
        if self.how == "exception":
            raise ValueError("a callback failed")
        return False


@pytest.mark.parametrize(
    "how",
    ["KeyboardInterrupt", "callback returns False", pytest.param("exception", marks=pytest.mark.slow)],
)
def test_stopping_learn_stops_the_learner(how: str, deadline: None) -> None:
    model = async_model()
    callback = StopDuringUpdate(how)
    if how == "callback returns False":
        model.learn(4 * STEPS_PER_UPDATE, callback=callback)
        assert model.policy_version == 1  # an ordinary stop applies the update in flight
    else:
        with pytest.raises((KeyboardInterrupt, ValueError)):
            model.learn(4 * STEPS_PER_UPDATE, callback=callback)
        assert model.policy_version == 0  # an interruption discards it: the last applied version stays
    assert callback.pid is not None
    assert_no_learner_left(model, callback.pid)


def test_max_version_lag_0_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="max_version_lag >= 1"):
        make_model(async_training=True, max_version_lag=0)


def test_the_learner_process_imports_the_update_code_without_the_env_layer() -> None:
    # What the spawned learner imports to unpickle the trainer: no env copies, evaluation or algorithm class.
    code = (
        "import sys, pickle, sb3_ippo.update.learner\n"
        "print(sorted(name for name in sys.modules if name.startswith(('sb3_ippo.vec_env', 'sb3_ippo.ippo', "
        "'sb3_ippo.common.evaluation', 'sb3_ippo.serialization'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


UNGUARDED_SCRIPT = """
import torch as th
from sb3_ippo import IPPO
from tests.envs import DyingAgentsEnv

th.set_num_threads(1)
model = IPPO("MlpPolicy", DyingAgentsEnv(), n_episodes=2, n_epochs=2, policy_kwargs=dict(net_arch=[16]), seed=0,
             async_training=True)
model.learn(40)
print("policy_version", model.policy_version)
"""


def test_a_script_without_a_main_guard_trains_with_async_training(tmp_path: pathlib.Path, deadline: None) -> None:
    # The learner does not run the main script again (which would start training there too): nothing it needs is in it.
    script = tmp_path / "train.py"
    script.write_text(UNGUARDED_SCRIPT)
    root = pathlib.Path(__file__).resolve().parent.parent
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, cwd=root, timeout=120,
                            env={**os.environ, "PYTHONPATH": str(root)})
    assert result.returncode == 0, result.stderr[-2000:]
    assert "policy_version 3" in result.stdout


SCRIPT_WITH_A_POLICY_CLASS = """
import torch as th
from stable_baselines3.common.policies import ActorCriticPolicy
import sb3_ippo.common.on_policy_algorithm
from sb3_ippo import IPPO
from tests.envs import DyingAgentsEnv

sb3_ippo.common.on_policy_algorithm.AUTO_MIN_TIMESTEPS = 0  # "auto" would start a learner for this short learn


class MyPolicy(ActorCriticPolicy):
    pass


def train():
    th.set_num_threads(1)
    print("TRAIN-START")
    model = IPPO(MyPolicy, DyingAgentsEnv(), n_episodes=2, n_epochs=2, policy_kwargs=dict(net_arch=[16]), seed=0,
                 async_training=ASYNC)
    try:
        model.learn(40)
    except RuntimeError as error:
        print("refused:", error)
    print("policy_version", model.policy_version)
"""


def run_script(tmp_path: pathlib.Path, text: str) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "train.py"
    script.write_text(text)
    root = pathlib.Path(__file__).resolve().parent.parent
    return subprocess.run([sys.executable, str(script)], capture_output=True, text=True, cwd=root, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(root)})


@pytest.mark.parametrize("async_training", [True, "auto"])
def test_a_class_from_a_script_without_a_main_guard_never_starts_its_training_twice(
    async_training: bool | str, tmp_path: pathlib.Path, deadline: None
) -> None:
    # The learner would have to import the script, which would train again there: True refuses, "auto" trains here.
    result = run_script(tmp_path, SCRIPT_WITH_A_POLICY_CLASS.replace("ASYNC", repr(async_training)) + "train()\n")
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.count("TRAIN-START") == 1
    if async_training is True:
        assert "refused: async_training sends the policies" in result.stdout and "no `if __name__" in result.stdout
        assert "policy_version 0" in result.stdout  # refused before any update
    else:
        assert 'async_training="auto": the updates run in this process' in result.stderr
        assert "policy_version 3" in result.stdout


def test_a_class_from_a_guarded_script_trains_in_the_learner(tmp_path: pathlib.Path, deadline: None) -> None:
    text = SCRIPT_WITH_A_POLICY_CLASS.replace("ASYNC", "True") + 'if __name__ == "__main__":\n    train()\n'
    result = run_script(tmp_path, text)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.count("TRAIN-START") == 1 and "policy_version 3" in result.stdout


@pytest.mark.parametrize(
    ("source", "guarded"),
    [
        ('if __name__ == "__main__":\n    main()\n', True),
        ("if '__main__' == __name__:\n    main()\n", True),
        ("main()\n", False),
        ('def f():\n    if __name__ == "__main__":\n        main()\n', False),  # not at the top level
        ("if __name__ == '__mp_main__':\n    main()\n", False),
        ("this is not python(\n", True),  # unreadable: nothing is refused on a guess
    ],
)
def test_guards_main(source: str, guarded: bool, tmp_path: pathlib.Path) -> None:
    script = tmp_path / "script.py"
    script.write_text(source)
    assert guards_main(str(script)) is guarded


def test_a_class_from_an_interactive_session_is_a_clear_error_before_any_process_starts() -> None:
    code = (
        "import sys, torch as th\n"
        "from stable_baselines3.common.policies import ActorCriticPolicy\n"
        "from sb3_ippo import IPPO\n"
        "from tests.envs import DyingAgentsEnv\n"
        "class MyPolicy(ActorCriticPolicy): pass\n"
        "model = IPPO(MyPolicy, DyingAgentsEnv(), n_episodes=2, n_epochs=1, policy_kwargs=dict(net_arch=[8]), "
        "async_training=True)\n"
        "try:\n"
        "    model.learn(40)\n"
        "except RuntimeError as error:\n"
        "    print('refused:', error)\n"
    )
    root = pathlib.Path(__file__).resolve().parent.parent
    # `python -` reads the program from standard input: an interactive main module, with neither file nor spec.
    result = subprocess.run([sys.executable, "-"], input=code, capture_output=True, text=True, cwd=root, timeout=120,
                            env={**os.environ, "PYTHONPATH": str(root)})
    assert "refused: async_training sends the policies to a learner process" in result.stdout, result.stderr[-2000:]
    assert "Define it in a module" in result.stdout


# --- async_training="auto" -------------------------------------------------------------------------------------------


def test_auto_updates_in_this_process_for_a_short_learn() -> None:
    auto = make_model(async_training="auto")
    auto.learn(4 * EPISODE_LENGTH)  # before the next model is made: making one seeds torch's global generator
    sync = make_model(async_training=False)
    sync.learn(4 * EPISODE_LENGTH)
    assert auto._learner is None and auto.policy_version == sync.policy_version == 2
    assert_same_parameters(parameters(auto), parameters(sync))


def test_auto_starts_a_learner_for_a_long_learn(monkeypatch: pytest.MonkeyPatch, deadline: None) -> None:
    monkeypatch.setattr(learner_module, "AUTO_MIN_TIMESTEPS", 2 * EPISODE_LENGTH)
    monkeypatch.setattr(on_policy_algorithm, "AUTO_MIN_TIMESTEPS", 2 * EPISODE_LENGTH)
    monkeypatch.setattr(on_policy_algorithm, "why_no_learner", lambda: None)  # as on a machine with two cores
    auto = make_model(async_training="auto")
    auto.learn(6 * EPISODE_LENGTH)
    learner = make_model(async_training=True)
    learner.learn(6 * EPISODE_LENGTH)
    assert auto.policy_version == learner.policy_version == 3
    assert_same_parameters(parameters(auto), parameters(learner))  # the learner's results, lag 1 and all


def test_auto_updates_in_this_process_where_no_learner_can_run(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(on_policy_algorithm, "AUTO_MIN_TIMESTEPS", 1)
    monkeypatch.setattr(on_policy_algorithm, "why_no_learner", lambda: "this process has a single CPU core")
    started = []
    monkeypatch.setattr(on_policy_algorithm, "LearnerProcess", lambda trainer: started.append(trainer))
    model = make_model(async_training="auto")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a documented choice, not a fallback: no warning
        model.learn(4 * EPISODE_LENGTH)
    assert not started and model.policy_version == 2


def test_auto_warns_once_and_updates_here_when_the_policies_cannot_be_sent(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(on_policy_algorithm, "AUTO_MIN_TIMESTEPS", 1)
    monkeypatch.setattr(on_policy_algorithm, "why_no_learner", lambda: None)
    model = make_model(async_training="auto", policy_kwargs=dict(net_arch=[16], activation_fn=lambda: th.nn.Tanh()))
    with pytest.warns(UserWarning, match='async_training="auto": the updates run in this process.*picklable') as caught:
        model.learn(4 * EPISODE_LENGTH)
    assert len([w for w in caught if "async_training" in str(w.message)]) == 1
    assert model._learner is None and model.policy_version == 2


def test_in_a_daemonic_process_true_is_a_clear_error_and_auto_trains_here(monkeypatch: pytest.MonkeyPatch) -> None:
    daemon = type("DaemonProcess", (), {"daemon": True})()
    monkeypatch.setattr(learner_module.multiprocessing, "current_process", lambda: daemon)
    monkeypatch.setattr(on_policy_algorithm, "AUTO_MIN_TIMESTEPS", 1)
    with pytest.raises(RuntimeError, match="async_training starts a learner process, which a daemonic process"):
        make_model(async_training=True).learn(4 * EPISODE_LENGTH)
    auto = make_model(async_training="auto")
    auto.learn(4 * EPISODE_LENGTH)
    assert auto._learner is None and auto.policy_version == 2
