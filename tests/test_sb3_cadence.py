"""The default batch rule end to end against SB3: one rollout of every copy, on a real PettingZoo env whose episodes do
not divide ``rollout_len``, gives each agent the advantages and returns that SB3's ``RolloutBuffer`` computes from the
same steps (episodes cut by the rollout's end bootstrap from V(next obs), time limits from V(final obs), as SB3's
``collect_rollouts`` adds ``gamma * V(terminal_observation)`` to the last reward). With ``align_rollouts=False`` the
rollout is SB3's ``n_steps=rollout_len`` to the step; with the default, it ends at the episode end every copy reaches
together, as SB3's rollout of that many steps would.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch as th
from stable_baselines3.common.buffers import RolloutBuffer

import sb3_ippo.update.batch
import sb3_ippo.update.stacked_update
from sb3_ippo import IPPO, make_vec_env
from sb3_ippo.common.buffer import copy_row
from sb3_ippo.update.batch import AgentBatch, DrainedBatch

mpe2 = pytest.importorskip("mpe2")
from mpe2 import simple_spread_v3  # noqa: E402

ROLLOUT_LEN, EPISODE_LEN, N_ENVS = 7, 5, 2  # copies' rollouts end in the middle of their second episode
GAMMA, GAE_LAMBDA = 0.9, 0.8


def record_steps(model: IPPO) -> dict[str, list[dict[str, Any]]]:
    """Every step each agent's buffer is given, as copies of its arguments."""
    steps: dict[str, list[dict[str, Any]]] = {agent: [] for agent in model.possible_agents}
    for agent, buffer in model.buffers.items():
        add = buffer.add

        def recording_add(*args: Any, add: Any = add, agent: str = agent) -> None:
            names = ("acted", "obs", "actions", "rewards", "values", "log_probs", "terminations", "truncations",
                     "next_obs", "final_obs")  # fmt: skip
            steps[agent].append({name: copy_row(value) for name, value in zip(names, args, strict=False)})
            add(*args)

        buffer.add = recording_add  # type: ignore[method-assign]
    return steps


def record_batches(monkeypatch: pytest.MonkeyPatch) -> list[tuple[DrainedBatch, AgentBatch]]:
    """Every (drained trajectories, training batch) pair the update builds, on the batched and the reference path."""
    built: list[tuple[DrainedBatch, AgentBatch]] = []
    finish_batch = sb3_ippo.update.batch.finish_batch

    def recording_finish_batch(drained: DrainedBatch, *args: Any, **kwargs: Any) -> AgentBatch:
        batch = finish_batch(drained, *args, **kwargs)
        built.append((drained, batch))
        return batch

    monkeypatch.setattr(sb3_ippo.update.batch, "finish_batch", recording_finish_batch)
    monkeypatch.setattr(sb3_ippo.update.stacked_update, "finish_batch", recording_finish_batch)
    return built


@th.no_grad()
def values_of(model: IPPO, agent: str, obs: np.ndarray) -> np.ndarray:
    return model.policies[agent].predict_values(th.as_tensor(obs, dtype=th.float32)).flatten().numpy()


def sb3_advantages(model: IPPO, agent: str, steps: list[dict[str, Any]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """SB3's observations, advantages and returns of the agent's rollout, in the order of IPPO's batch: the
    trajectories as they ended (a copy's episode end, or the rollout's end), copies in order within one step."""
    policy = model.policies[agent]
    buffer = RolloutBuffer(len(steps), policy.observation_space, policy.action_space, "cpu", GAE_LAMBDA, GAMMA, n_envs=N_ENVS)
    episode_starts = np.ones(N_ENVS, dtype=np.float32)
    ends: list[tuple[int, int]] = []  # (step, copy) of each trajectory's last step
    for t, step in enumerate(steps):
        assert step["acted"].all()  # simple_spread: every agent acts in every step of every copy
        rewards = step["rewards"].astype(np.float32).copy()
        for env_idx in np.flatnonzero(step["truncations"] & ~step["terminations"]):
            final_obs = step["final_obs"][env_idx]  # SB3: infos[idx]["terminal_observation"]
            rewards[env_idx] += GAMMA * values_of(model, agent, final_obs[None])[0]
        buffer.add(
            step["obs"],
            step["actions"],
            rewards,
            episode_starts,
            th.as_tensor(values_of(model, agent, step["obs"])),
            th.as_tensor(step["log_probs"]),
        )
        episode_starts = (step["terminations"] | step["truncations"]).astype(np.float32)
        ends += [(t, env_idx) for env_idx in range(N_ENVS) if episode_starts[env_idx] or t == len(steps) - 1]
    last_values = th.as_tensor(values_of(model, agent, steps[-1]["next_obs"]))
    buffer.compute_returns_and_advantage(last_values, episode_starts.astype(bool))
    rows: list[tuple[int, int]] = []  # (step, copy) in IPPO's order
    start = [0] * N_ENVS
    for t, env_idx in ends:
        rows += [(s, env_idx) for s in range(start[env_idx], t + 1)]
        start[env_idx] = t + 1
    steps_index, copies_index = np.array(rows).T
    return (
        buffer.observations[steps_index, copies_index],
        buffer.advantages[steps_index, copies_index],
        buffer.returns[steps_index, copies_index],
    )


@pytest.mark.parametrize("batched", [True, False])
@pytest.mark.parametrize(
    ("align_rollouts", "rollout_steps", "lengths"),
    [
        # Per copy: a whole 5-step episode (a time limit), then the first 2 steps of the next, cut by the rollout.
        (False, ROLLOUT_LEN, [EPISODE_LEN] * N_ENVS + [ROLLOUT_LEN - EPISODE_LEN] * N_ENVS),
        # Another 5-step episode would not fit in the rollout of 7: it ends with the first episodes, none cut.
        (True, EPISODE_LEN, [EPISODE_LEN] * N_ENVS),
    ],
)
def test_one_rollout_of_the_default_rule_has_sb3_rollout_buffer_advantages(
    monkeypatch: pytest.MonkeyPatch, batched: bool, align_rollouts: bool, rollout_steps: int, lengths: list[int]
) -> None:
    env = make_vec_env(simple_spread_v3.parallel_env, n_envs=N_ENVS, seed=0, env_kwargs=dict(N=2, max_cycles=EPISODE_LEN))
    # A learning rate of 0: the update leaves the networks as they were, so SB3's values can be computed after it.
    model = IPPO(
        "MlpPolicy", env, rollout_len=ROLLOUT_LEN, align_rollouts=align_rollouts, gamma=GAMMA, gae_lambda=GAE_LAMBDA,
        learning_rate=lambda _: 0.0, normalize_returns=False, n_epochs=1, batched=batched,
        policy_kwargs=dict(net_arch=[16]), seed=0,
    )  # fmt: skip
    steps = record_steps(model)
    built = record_batches(monkeypatch)

    model.learn(rollout_steps * N_ENVS)

    assert model.policy_version == 1 and len(built) == len(model.possible_agents)
    expected = {agent: sb3_advantages(model, agent, steps[agent]) for agent in model.possible_agents}
    matched = []
    for drained, batch in built:
        assert drained.lengths == lengths
        observations = batch.observations.numpy()
        [agent] = [agent for agent, table in expected.items() if np.array_equal(table[0], observations)]
        matched.append(agent)
        _, advantages, returns = expected[agent]
        np.testing.assert_allclose(batch.advantages.numpy(), advantages, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(batch.returns.numpy(), returns, rtol=1e-5, atol=1e-6)
    assert sorted(matched) == sorted(model.possible_agents)
