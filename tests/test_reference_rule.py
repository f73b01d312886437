"""The reference's batch rule (``n_episodes=8`` whole trajectories per agent, ``batch_size=None``) is pinned: a seeded
synchronous run must end with the parameters that the code of commit a144363 (before ``rollout_len`` took SB3's
rollout cadence) gave, so that a change of another batch rule cannot move it.

``tests/data/reference_rule_params.npz`` was written by that commit's code, torch 2.x CPU:

    PYTHONPATH=<checkout of a144363> python tests/test_reference_rule.py tests/data/reference_rule_params.npz

Re-make it only for an intended change of the reference path (for example of a default that ``SETTINGS`` leaves out),
and say so in the commit.
"""

from __future__ import annotations

import pathlib
import sys
from typing import Any

import numpy as np

from sb3_ippo import IPPO, make_vec_env
from tests.envs import VariableLengthEnv

PINNED = pathlib.Path(__file__).resolve().parent / "data" / "reference_rule_params.npz"
# The reference's rule and IPPO's update settings of that commit, written out so that a later change of a default does
# not read as a change of the rule.
SETTINGS: dict[str, Any] = dict(
    n_episodes=8, n_steps=None, rollout_len=None, batch_size=None, n_epochs=20, target_kl=0.02, kl_stop="after_step",
    learning_rate=3e-4, gamma=0.99, gae_lambda=0.97, normalize_returns=True, time_limit_bootstrap=True,
    async_training=False, shuffle_minibatches=False, policy_kwargs=dict(net_arch=[16]), seed=0, device="cpu",
)


def train_reference_rule() -> dict[str, np.ndarray]:
    """Every parameter of every agent after 300 env steps on 3 copies whose episodes last 2 to 9 steps (so copies
    finish together and leave trajectories waiting for the next update)."""
    env = make_vec_env(lambda: VariableLengthEnv(n_agents=2, min_length=2, max_length=9), n_envs=3, seed=0)
    model = IPPO("MlpPolicy", env, **SETTINGS)
    model.learn(300)
    params = {f"{agent}/{name}": p.detach().numpy().copy() for agent, policy in model.policies.items()
              for name, p in policy.state_dict().items()}
    params["policy_version"] = np.array(model.policy_version)
    return params


def test_the_reference_rule_trains_as_before() -> None:
    pinned = np.load(PINNED)
    params = train_reference_rule()
    assert sorted(params) == sorted(pinned.files)
    assert int(params["policy_version"]) == int(pinned["policy_version"]) > 3
    for name in pinned.files:
        # Bit-for-bit on the machine that wrote the file; across machines, CPU float rounding may differ slightly.
        np.testing.assert_allclose(params[name], pinned[name], rtol=1e-4, atol=1e-6, err_msg=name)


if __name__ == "__main__":
    np.savez(sys.argv[1], **train_reference_rule())
