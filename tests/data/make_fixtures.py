"""Make the saved-model fixtures of ``tests/test_saved_files.py``: files written by the code of one commit, so that
later code is held to loading them and predicting exactly as that code did.

Made at commit 67de84d (sb3_ippo 0.1.0, torch 2.13 CPU). Run from the repository root, on that commit:

    python tests/data/make_fixtures.py

It overwrites the files below. Do not re-run it on later code: the point of the files is that they are old.

- ``ippo_0_1_normalized_obs.safetensors`` (+ ``_expected.npz``): four agents with Discrete, Box, MultiDiscrete and
  MultiBinary actions, ``normalize_obs=True`` and the default ``normalize_returns=True``.
- ``ippo_0_1_shared_group.zip`` and ``ippo_0_1_shared_group.safetensors`` (+ ``_expected.npz``): the three agents of
  :class:`tests.envs.DyingAgentsEnv` in one group with ``share_parameters=True`` and ``normalize_obs=True``: one
  policy, one observation normalizer and one return normalizer for the three.

Each ``_expected.npz`` holds a fixed observation batch per agent (``obs/<agent>``), the deterministic actions the
model gave for it (``actions/<agent>``), the normalizer statistics (``obs_mean/<agent>``, ``obs_var/<agent>``,
``obs_count/<agent>``, ``return_mean/<agent>``, ``return_var/<agent>``, ``return_count/<agent>``) and
``policy_version``.
"""

from __future__ import annotations

import pathlib
import sys
from typing import Any

import numpy as np
import torch as th

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from sb3_ippo import IPPO  # noqa: E402
from tests.envs import DyingAgentsEnv, HeterogeneousEnv  # noqa: E402

DATA = pathlib.Path(__file__).resolve().parent
NORMALIZED_OBS_AGENTS = ["discrete", "box", "multi_discrete", "multi_binary"]


def observation_batch(model: IPPO, n: int = 16, seed: int = 0) -> dict[str, np.ndarray]:
    """``n`` observations per agent from its observation space, scaled up so that normalization clips some."""
    batch = {}
    for offset, agent in enumerate(model.possible_agents):
        rng = np.random.default_rng(seed + offset)
        space = model.observation_spaces[agent]
        batch[agent] = rng.uniform(-3.0, 3.0, (n, *space.shape)).astype(space.dtype)
    return batch


def expected(model: IPPO) -> dict[str, Any]:
    obs = observation_batch(model)
    actions, _ = model.predict(obs, deterministic=True)
    arrays: dict[str, Any] = {"policy_version": np.array(model.policy_version)}
    for agent in model.possible_agents:
        arrays[f"obs/{agent}"] = obs[agent]
        arrays[f"actions/{agent}"] = actions[agent]
        obs_rms = model.obs_normalizers[agent].obs_rms  # type: ignore[index]
        return_rms = model.return_normalizers[agent].return_rms  # type: ignore[index]
        arrays[f"obs_mean/{agent}"], arrays[f"obs_var/{agent}"] = obs_rms.mean, obs_rms.var  # type: ignore[union-attr]
        arrays[f"obs_count/{agent}"] = np.array(obs_rms.count)  # type: ignore[union-attr]
        arrays[f"return_mean/{agent}"], arrays[f"return_var/{agent}"] = return_rms.mean, return_rms.var
        arrays[f"return_count/{agent}"] = np.array(return_rms.count)
    return arrays


def make_normalized_obs() -> None:
    model = IPPO("MlpPolicy", HeterogeneousEnv(NORMALIZED_OBS_AGENTS), n_episodes=4, n_epochs=2, normalize_obs=True,
                 policy_kwargs=dict(net_arch=[16]), seed=0)
    model.learn(3 * 4 * 4)
    model.save(DATA / "ippo_0_1_normalized_obs.safetensors")
    np.savez(DATA / "ippo_0_1_normalized_obs_expected.npz", **expected(model))


def make_shared_group() -> None:
    model = IPPO("MlpPolicy", DyingAgentsEnv(), n_episodes=2, n_epochs=2, normalize_obs=True, share_parameters=True,
                 policy_kwargs=dict(net_arch=[16]), seed=0)
    model.learn(300)
    assert dict(model.groups) == {"agent": ["agent_0", "agent_1", "agent_2"]}
    assert model.policies["agent_0"] is model.policies["agent_2"]
    model.save(DATA / "ippo_0_1_shared_group.zip")
    model.save(DATA / "ippo_0_1_shared_group.safetensors")
    np.savez(DATA / "ippo_0_1_shared_group_expected.npz", **expected(model))


if __name__ == "__main__":
    th.set_num_threads(1)
    make_normalized_obs()
    make_shared_group()
