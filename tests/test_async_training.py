"""``async_training``: each update runs in a background thread on copies of the policies while collection goes on
with the previous version (the reference's background training, docs/algorithm.md). On :class:`DyingAgentsEnv` (see
``test_run.py``) one copy gives one 2-, 4- and 6-step trajectory per episode of 6 env steps, so with
``n_episodes=2`` an update is due every 12 env steps and no trajectory is left over.
"""

from __future__ import annotations

import pathlib
import threading
from typing import Any

import pytest
import torch as th
from stable_baselines3.common.callbacks import BaseCallback

import sb3_ippo.ippo.ippo as ippo_module
from sb3_ippo import IPPO, make_vec_env
from tests.envs import DyingAgentsEnv
from tests.test_run import EPISODE_LENGTH, assert_same_parameters, make_model, parameters, record_logs, spy_on_batches

STEPS_PER_UPDATE = 2 * EPISODE_LENGTH


def test_every_batch_after_the_first_was_collected_by_the_previous_version(monkeypatch: pytest.MonkeyPatch) -> None:
    model = make_model(async_training=True)
    drained_versions = spy_on_batches(monkeypatch, model)
    model.learn(5 * STEPS_PER_UPDATE)
    assert model.policy_version == 5
    assert model.stale_episodes_dropped == 0
    assert drained_versions[:3] == [(0, [0, 0])] * 3  # 3 agents
    for version, trajectory_versions in drained_versions[3:]:
        assert trajectory_versions == [version - 1, version - 1]


class OverlapWatcher(BaseCallback):
    """Records, at every env step, the policy version and agent_0's weights; tells the (held) update when it has
    seen a step of collection while that update was in flight."""

    def __init__(self) -> None:
        super().__init__()
        self.collected_during_update = threading.Event()
        self.steps: list[tuple[int, dict[str, th.Tensor]]] = []

    def _on_step(self) -> bool:
        self.steps.append((self.model.policy_version, parameters(self.model)["agent_0"]))
        if self.model._update_in_flight is not None:
            self.collected_during_update.set()
        return True


def test_collection_goes_on_with_unchanged_policies_while_the_update_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    watcher = OverlapWatcher()
    update_waited: list[bool] = []

    def held(update: Any) -> Any:
        def held_update(*args: Any, **kwargs: Any) -> Any:
            # The first update waits until collection has stepped while it was in flight.
            if not update_waited:
                update_waited.append(watcher.collected_during_update.wait(timeout=30))
            return update(*args, **kwargs)

        return held_update

    monkeypatch.setattr(ippo_module, "ppo_update", held(ippo_module.ppo_update))
    monkeypatch.setattr(ippo_module, "stacked_ppo_update", held(ippo_module.stacked_ppo_update))
    model = make_model(async_training=True)
    model.learn(3 * STEPS_PER_UPDATE, callback=watcher)
    assert update_waited == [True]
    assert model.policy_version == 3
    # The acting weights change only when a version is applied, never in the middle of a version's collection.
    by_version: dict[int, dict[str, th.Tensor]] = {}
    for version, weights in watcher.steps:
        first = by_version.setdefault(version, weights)
        assert all(th.equal(first[name], weights[name]) for name in weights), version
    assert sorted(by_version) == [0, 1]  # update 3 is applied when learn ends
    assert any(not th.equal(by_version[0][name], by_version[1][name]) for name in by_version[0])


def test_the_first_update_equals_the_synchronous_one() -> None:
    # Until the first update is applied, both modes see the same data and start from the same weights.
    def first_update(async_training: bool) -> dict[str, dict[str, th.Tensor]]:
        model = make_model(async_training=async_training, shuffle_minibatches=True)  # seeds torch's global RNG
        model.learn(STEPS_PER_UPDATE)
        assert model.policy_version == 1
        return parameters(model)

    assert_same_parameters(first_update(False), first_update(True))


def test_runs_are_reproducible_with_a_seed() -> None:
    def trained() -> dict[str, dict[str, th.Tensor]]:
        model = make_model(make_vec_env(DyingAgentsEnv, n_envs=2), async_training=True, shuffle_minibatches=True,
                           normalize_obs=True)
        model.learn(4 * STEPS_PER_UPDATE)
        return parameters(model)

    assert_same_parameters(trained(), trained())


def test_the_logger_gets_every_update_once() -> None:
    model = make_model(async_training=True)
    output = record_logs(model)
    model.learn(5 * STEPS_PER_UPDATE)
    versions = [dump["train/policy_version"] for dump in output.dumps if "train/policy_version" in dump]
    assert versions == [1, 2, 3, 4, 5]
    assert "train/policy_loss" in output.dumps[-1]


def test_save_while_an_update_runs_keeps_the_applied_version(tmp_path: pathlib.Path) -> None:
    saved: list[tuple[int, dict[str, dict[str, th.Tensor]]]] = []

    class SaveDuringUpdate(BaseCallback):
        def _on_step(self) -> bool:
            if self.model._update_in_flight is not None and not saved:
                self.model.save(tmp_path / "model.zip")
                saved.append((self.model.policy_version, parameters(self.model)))
            return True

    model = make_model(async_training=True)
    model.learn(3 * STEPS_PER_UPDATE, callback=SaveDuringUpdate())
    loaded = IPPO.load(tmp_path / "model.zip", env=DyingAgentsEnv())
    version, weights = saved[0]
    assert loaded.policy_version == version == 0
    assert loaded.async_training
    assert_same_parameters(parameters(loaded), weights)
    loaded.learn(2 * STEPS_PER_UPDATE, reset_num_timesteps=False)
    assert loaded.policy_version == 2


def test_an_error_in_the_background_update_reaches_learn(monkeypatch: pytest.MonkeyPatch) -> None:
    def failing_update(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("update failed")

    monkeypatch.setattr(ippo_module, "ppo_update", failing_update)
    monkeypatch.setattr(ippo_module, "stacked_ppo_update", failing_update)
    model = make_model(async_training=True)
    with pytest.raises(RuntimeError, match="update failed"):
        model.learn(3 * STEPS_PER_UPDATE)
    assert model.policy_version == 0
    assert model._update_in_flight is None


def test_max_version_lag_0_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="max_version_lag >= 1"):
        make_model(async_training=True, max_version_lag=0)
