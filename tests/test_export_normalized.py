"""``export_agent`` of a ``normalize_obs`` model: a plain SB3 PPO zip that takes raw observations, the frozen
statistics folded into its first layers, loadable without sb3_ippo."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys
from typing import Any

import numpy as np
import pytest
from stable_baselines3 import PPO

from sb3_ippo import IPPO
from sb3_ippo.update.runners import policy_input
from tests.envs import DyingAgentsEnv, HeterogeneousEnv
from tests.helpers import observation_batch


def trained(env: Any, policy: str = "MlpPolicy", **kwargs: Any) -> IPPO:
    model = IPPO(policy, env, n_episodes=2, n_epochs=2, normalize_obs=True, seed=0, **kwargs)
    model.learn(48)
    return model


def assert_statistics_matter(model: IPPO, agent: str) -> None:
    """The running statistics are far from the identity: exporting without them would change the network's input."""
    assert model.obs_normalizers is not None
    rms = model.obs_normalizers[agent].obs_rms
    entries = rms.values() if isinstance(rms, dict) else [rms]
    assert any(np.abs(entry.mean).max() > 0.05 or np.abs(entry.var - 1).max() > 0.05 for entry in entries)


@pytest.mark.parametrize(
    ("make_env", "agent", "net_arch"),
    [
        (DyingAgentsEnv, "agent_1", [16]),
        (DyingAgentsEnv, "agent_1", dict(pi=[], vf=[8])),  # no hidden actor layer: the output layer is folded
        (lambda: HeterogeneousEnv(agents=["box", "multi_discrete", "multi_binary"]), "multi_discrete", [16]),
        (lambda: HeterogeneousEnv(agents=["box", "multi_discrete", "multi_binary"]), "multi_binary", [16]),
    ],
    ids=["discrete", "no hidden actor layer", "multi_discrete", "multi_binary"],
)
def test_exported_normalize_obs_agent_acts_as_the_model_on_raw_observations(
    tmp_path: pathlib.Path, make_env: Any, agent: str, net_arch: Any
) -> None:
    model = trained(make_env(), policy_kwargs=dict(net_arch=net_arch))
    assert_statistics_matter(model, agent)
    model.export_agent(agent, tmp_path / "agent.zip")
    observations = observation_batch(model, n=64)[agent]
    expected, _ = model.predict({agent: observations}, deterministic=True)
    actions, _ = PPO.load(tmp_path / "agent.zip").predict(observations, deterministic=True)
    np.testing.assert_array_equal(actions, expected[agent])


def test_exported_continuous_actions_match_up_to_float_rounding(tmp_path: pathlib.Path) -> None:
    model = trained(HeterogeneousEnv(agents=["box", "discrete"]), policy_kwargs=dict(net_arch=[16]))
    assert_statistics_matter(model, "box")
    model.export_agent("box", tmp_path / "agent.zip")
    observations = observation_batch(model, n=64)["box"]
    # Actions before clipping to the action space, so that a difference is not hidden by the clip.
    normalized = policy_input(observations, model.observation_spaces["box"], model.obs_normalizers["box"])
    expected = model.policies["box"].predict(normalized, deterministic=True)[0]
    actions, _ = PPO.load(tmp_path / "agent.zip").policy.predict(observations, deterministic=True)
    np.testing.assert_allclose(actions, expected, rtol=1e-5, atol=1e-6)


def test_dict_observations_fold_their_normalized_entries(tmp_path: pathlib.Path) -> None:
    model = trained(HeterogeneousEnv(agents=["dict"]), "MultiInputPolicy", policy_kwargs=dict(net_arch=[16]))
    assert_statistics_matter(model, "dict")
    model.export_agent("dict", tmp_path / "agent.zip")
    space = model.observation_spaces["dict"]
    space.seed(0)
    samples = [space.sample() for _ in range(64)]
    observations = {key: np.stack([sample[key] for sample in samples]) for key in space.spaces}
    expected, _ = model.predict({"dict": observations}, deterministic=True)
    actions, _ = PPO.load(tmp_path / "agent.zip").predict(observations, deterministic=True)
    np.testing.assert_array_equal(actions, expected["dict"])


def test_without_folding_the_actions_would_differ(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The equality tests above can fail: the same model exported without the fold acts otherwise.
    model = trained(DyingAgentsEnv(), policy_kwargs=dict(net_arch=[16]))
    monkeypatch.setattr("sb3_ippo.common.export.fold_observation_normalization", lambda policy, normalizer: None)
    model.export_agent("agent_1", tmp_path / "agent.zip")
    observations = observation_batch(model, n=256)["agent_1"]
    expected, _ = model.predict({"agent_1": observations}, deterministic=True)
    actions, _ = PPO.load(tmp_path / "agent.zip").predict(observations, deterministic=True)
    assert not np.array_equal(actions, expected["agent_1"])


LOAD_WITHOUT_SB3_IPPO = """
import importlib.abc, json, sys
class NoSb3Ippo(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "sb3_ippo" or name.startswith("sb3_ippo."):
            raise ImportError("sb3_ippo must not be imported to load an exported agent")
sys.meta_path.insert(0, NoSb3Ippo())
import numpy as np
from stable_baselines3 import PPO
observations = np.array(json.loads(sys.argv[2]), dtype=np.float32)
actions, _ = PPO.load(sys.argv[1]).predict(observations, deterministic=True)
print(json.dumps(actions.tolist()))
"""


def test_stable_baselines3_loads_the_export_without_sb3_ippo(tmp_path: pathlib.Path) -> None:
    model = trained(DyingAgentsEnv(), policy_kwargs=dict(net_arch=[16]))
    model.export_agent("agent_1", tmp_path / "agent.zip")
    observations = observation_batch(model, n=32)["agent_1"]
    run = subprocess.run(
        [sys.executable, "-c", LOAD_WITHOUT_SB3_IPPO, str(tmp_path / "agent.zip"), json.dumps(observations.tolist())],
        capture_output=True, text=True, cwd=tmp_path, check=False,
    )
    assert run.returncode == 0, run.stderr
    expected, _ = model.predict({"agent_1": observations}, deterministic=True)
    assert json.loads(run.stdout) == expected["agent_1"].tolist()
