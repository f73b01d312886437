"""Files saved by earlier code load and predict exactly as they did when saved.

The files in ``tests/data`` were written by the commit that ``tests/data/make_fixtures.py`` names; each has an
``_expected.npz`` with what that code predicted and held.
"""

from __future__ import annotations

import pathlib
from typing import Any

import numpy as np
import pytest

from sb3_ippo import IPPO
from tests.envs import DyingAgentsEnv
from tests.helpers import EPISODE_LENGTH

DATA = pathlib.Path(__file__).resolve().parent / "data"
SHARED_GROUP = ("agent_0", "agent_1", "agent_2")

# (file, how to load it): every way a file of each format can be read.
NORMALIZED_OBS = [("ippo_0_1_normalized_obs.safetensors", True)]
SHARED_GROUP_FILES = [
    ("ippo_0_1_shared_group.zip", True),
    ("ippo_0_1_shared_group.zip", False),
    ("ippo_0_1_shared_group.safetensors", True),
]


def load(name: str, trusted: bool, env: Any = None) -> IPPO:
    return IPPO.load(DATA / name, env=env, trusted=trusted)


def expected_of(name: str) -> Any:
    return np.load(DATA / f"{name.rsplit('.', 1)[0]}_expected.npz")


def assert_predicts_as_saved(model: IPPO, expected: Any) -> None:
    """The deterministic actions stored when the file was made: discrete ones exactly; continuous ones up to the
    float32 rounding of another CPU or BLAS build (the fixtures were made on one machine; 5.6e-9 apart measured on
    another), which is far below any difference a wrong load would make."""
    observations = {agent: expected[f"obs/{agent}"] for agent in model.possible_agents}
    actions, _ = model.predict(observations, deterministic=True)
    for agent in model.possible_agents:
        stored = expected[f"actions/{agent}"]
        if np.issubdtype(stored.dtype, np.floating):
            np.testing.assert_allclose(actions[agent], stored, rtol=1e-5, atol=1e-6, err_msg=f"agent {agent!r}")
        else:
            np.testing.assert_array_equal(actions[agent], stored, err_msg=f"agent {agent!r}")


def assert_statistics_as_saved(model: IPPO, expected: Any) -> None:
    for agent in model.possible_agents:
        obs_rms = model.obs_normalizers[agent].obs_rms  # type: ignore[index]
        return_rms = model.return_normalizers[agent].return_rms  # type: ignore[index]
        for name, value in (("obs_mean", obs_rms.mean), ("obs_var", obs_rms.var), ("obs_count", obs_rms.count),  # type: ignore[union-attr]
                            ("return_mean", return_rms.mean), ("return_var", return_rms.var),
                            ("return_count", return_rms.count)):
            np.testing.assert_array_equal(np.asarray(value).reshape(np.shape(expected[f"{name}/{agent}"])),
                                          expected[f"{name}/{agent}"], err_msg=f"{name} of agent {agent!r}")


@pytest.mark.parametrize(("name", "trusted"), NORMALIZED_OBS + SHARED_GROUP_FILES)
def test_a_saved_model_predicts_as_it_did_when_saved(name: str, trusted: bool) -> None:
    expected = expected_of(name)

    model = load(name, trusted)

    assert model.policy_version == int(expected["policy_version"])
    assert_predicts_as_saved(model, expected)
    assert_statistics_as_saved(model, expected)


@pytest.mark.parametrize(("name", "trusted"), SHARED_GROUP_FILES)
def test_a_saved_shared_group_loads_with_one_normalizer_of_each_kind(name: str, trusted: bool) -> None:
    model = load(name, trusted)

    assert dict(model.groups) == {"agent": list(SHARED_GROUP)}
    first = SHARED_GROUP[0]
    for agent in SHARED_GROUP[1:]:
        assert model.policies[agent] is model.policies[first]
        assert model.obs_normalizers[agent] is model.obs_normalizers[first], f"obs normalizer of {agent!r}"  # type: ignore[index]
        assert model.return_normalizers[agent] is model.return_normalizers[first], f"return normalizer of {agent!r}"  # type: ignore[index]


@pytest.mark.parametrize(("name", "trusted"), SHARED_GROUP_FILES)
def test_a_saved_shared_group_goes_on_learning(name: str, trusted: bool) -> None:
    model = load(name, trusted, env=DyingAgentsEnv())

    model.learn(2 * EPISODE_LENGTH, reset_num_timesteps=False)

    assert model.policy_version == int(expected_of(name)["policy_version"]) + 1


def test_a_zip_saved_before_groups_existed_still_loads() -> None:
    loaded = IPPO.load(DATA / "ippo_v0_1_dying_agents.zip", env=DyingAgentsEnv())
    expected = np.load(DATA / "ippo_v0_1_dying_agents_expected.npz")

    assert loaded.policy_version == int(expected["policy_version"])
    for agent, policy in loaded.policies.items():
        for name, p in policy.named_parameters():
            np.testing.assert_array_equal(p.detach().numpy(), expected[f"{agent}/{name}"])
        np.testing.assert_array_equal(loaded.obs_normalizers[agent].obs_rms.mean, expected[f"{agent}/obs_rms_mean"])  # type: ignore[index, union-attr]
    assert dict(loaded.groups) == {"agent": ["agent_0", "agent_1", "agent_2"]}
    assert loaded.time_limit_bootstrap  # truncated episodes bootstrap, as they did when it was saved
    loaded.learn(2 * EPISODE_LENGTH, reset_num_timesteps=False)
    assert loaded.policy_version == int(expected["policy_version"]) + 1
