"""Property-based tests (hypothesis) of the episode buffer and the env layer, against plain reference models.

Every transition carries its identity in its values, so the checks can say which transition went where:

- The buffer: random alive masks, terminations, truncations, final observations, ``rollout_len``,
  ``max_buffered_episodes``, drains (``n_episodes`` or ``n_steps``) with advancing versions, and ``drop_open``,
  against a reference model that keeps plain lists. Drained batches, what waits, what is open and every counter
  must agree; and, whatever the reference says, no transition is duplicated or mislabelled, and every trajectory
  is a run of consecutive steps of one copy.
- The env layer: a scripted PettingZoo env whose agents join and leave (terminated, truncated, or dropped without a
  flag) at random steps of random-length episodes, and may even come back (a broken env), with
  ``max_episode_steps``, stepped by the vectorized env and
  checked step by step against a reference simulation of the rules (who acts, rewards, flags, final observations,
  episode ends and resets, no revival); then fed to per-agent buffers, where every transition must land exactly
  once, in a trajectory that is one unbroken piece of one agent's episode.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
from gymnasium import spaces
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from hypothesis.configuration import set_hypothesis_home_dir
from pettingzoo import ParallelEnv

from sb3_ippo.common.buffer import AgentEpisodeBuffer, Trajectory
from sb3_ippo.vec_env import DummyMultiAgentVecEnv

# Small numbers of examples keep the default suite fast; `--hypothesis-profile=thorough` digs deeper.
# No example database, and hypothesis's caches in the temp directory: the tests write nothing into the repository.
# A modest number of examples keeps the default suite fast; SB3_IPPO_HYPOTHESIS_EXAMPLES=2000 digs deeper.
set_hypothesis_home_dir(Path(tempfile.gettempdir()) / "sb3_ippo_hypothesis")
PROPERTY_SETTINGS = settings(
    max_examples=int(os.environ.get("SB3_IPPO_HYPOTHESIS_EXAMPLES", "60")),
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
    phases=[phase for phase in Phase if phase != Phase.explain],
)


# ================================================================================================================
# The buffer
# ================================================================================================================

# A transition's identity `i` (1, 2, ...): observation [i, copy], action i, reward i, value 10 i, log-prob -i; the
# observation after it is [-i, copy] (a trajectory cut by rollout_len bootstraps from it), and the final observation
# of a truncation, when the env gives one, [i + 0.5, copy].


@dataclass
class RefTrajectory:
    ids: list[int]
    env_idx: int
    version: int
    terminated: bool = False
    bootstrap: tuple[float, float] | None = None


@dataclass
class ReferenceBuffer:
    """What an AgentEpisodeBuffer must hold, kept with plain lists."""

    n_envs: int
    rollout_len: int | None
    max_buffered: int | None
    version_stamp: str = "episode_end"
    open: dict[int, RefTrajectory] = field(default_factory=dict)
    finished: list[RefTrajectory] = field(default_factory=list)
    stale: int = 0
    rejected: int = 0
    kept_steps: dict[int, int] = field(default_factory=dict)  # per copy: steps recorded and not forgotten by drop_open

    def add(self, env_idx: int, tid: int, version: int, terminated: bool, truncated: bool, final: bool, lag: int) -> None:
        trajectory = self.open.setdefault(env_idx, RefTrajectory([], env_idx, version))
        trajectory.ids.append(tid)
        self.kept_steps[env_idx] = self.kept_steps.get(env_idx, 0) + 1
        # SB3's cadence: a cut each time the copy's kept steps reach a multiple of rollout_len, across episode ends.
        cut = self.rollout_len is not None and self.kept_steps[env_idx] % self.rollout_len == 0
        if terminated:
            self._finish(env_idx, True, None, version, lag)
        elif truncated:
            self._finish(env_idx, False, (tid + 0.5, env_idx) if final else (tid, env_idx), version, lag)
        elif cut:
            self._finish(env_idx, False, (-tid, env_idx), version, lag)

    def _finish(self, env_idx: int, terminated: bool, bootstrap: Any, version: int, lag: int) -> None:
        trajectory = self.open.pop(env_idx)
        trajectory.terminated, trajectory.bootstrap = terminated, bootstrap
        if self.version_stamp == "episode_end":  # stamped at receipt; "first_step" keeps its first step's version
            trajectory.version = version
        if self.max_buffered is not None and len(self.finished) >= self.max_buffered:
            self.drop_stale(version, lag)
            if len(self.finished) >= self.max_buffered:
                self.rejected += 1
                return
        self.finished.append(trajectory)

    def drop_stale(self, version: int, lag: int) -> None:
        fresh = [t for t in self.finished if version - t.version <= lag]
        self.stale += len(self.finished) - len(fresh)
        self.finished = fresh

    def drain(self, n_episodes: int, n_steps: int | None, version: int, lag: int) -> list[RefTrajectory]:
        self.drop_stale(version, lag)
        batch: list[RefTrajectory] = []
        while self.finished and (
            sum(len(t.ids) for t in batch) < n_steps if n_steps is not None else len(batch) < n_episodes
        ):
            batch.append(self.finished.pop(0))
        return batch

    def drop_open(self, env_idx: int | None) -> int:
        indices = list(self.open) if env_idx is None else [env_idx] if env_idx in self.open else []
        for index in indices:
            self.kept_steps[index] -= len(self.open.pop(index).ids)
        return len(indices)


def describe(trajectory: Trajectory) -> tuple:
    """A trajectory as the reference model states it: (ids, copy, version, terminated, bootstrap)."""
    ids = trajectory.observations[:, 0].astype(int).tolist()
    env_idx = int(trajectory.observations[0, 1])
    bootstrap = None if trajectory.bootstrap_obs is None else tuple(float(x) for x in trajectory.bootstrap_obs)
    return ids, env_idx, trajectory.policy_version, trajectory.terminated, bootstrap


def ref_describe(trajectory: RefTrajectory) -> tuple:
    bootstrap = None if trajectory.bootstrap is None else tuple(float(x) for x in trajectory.bootstrap)
    return trajectory.ids, trajectory.env_idx, trajectory.version, trajectory.terminated, bootstrap


def assert_labelled(trajectory: Trajectory) -> None:
    """Every field of every step belongs to the transition whose identity its observation carries."""
    ids = trajectory.observations[:, 0]
    np.testing.assert_array_equal(trajectory.actions, ids)
    np.testing.assert_array_equal(trajectory.rewards, ids)
    np.testing.assert_array_equal(trajectory.values, 10 * ids)
    np.testing.assert_array_equal(trajectory.log_probs, -ids)
    assert len(set(trajectory.observations[:, 1].tolist())) == 1, "one trajectory, one env copy"
    assert not (trajectory.terminated and trajectory.bootstrap_obs is not None)


step_op = st.tuples(
    st.just("step"),
    st.lists(st.sampled_from(["skip", "continue", "terminate", "truncate", "truncate_no_final"]), min_size=3, max_size=3),
)
drain_op = st.tuples(st.just("drain"), st.integers(1, 4), st.one_of(st.none(), st.integers(1, 12)))
drop_op = st.tuples(st.just("drop_open"), st.one_of(st.none(), st.integers(0, 2)))


@PROPERTY_SETTINGS
@given(
    n_envs=st.integers(1, 3),
    rollout_len=st.one_of(st.none(), st.integers(1, 4)),
    max_buffered=st.one_of(st.none(), st.integers(1, 5)),
    lag=st.integers(0, 2),
    version_stamp=st.sampled_from(["episode_end", "first_step"]),
    ops=st.lists(st.one_of(step_op, step_op, step_op, drain_op, drop_op), max_size=40),
)
def test_buffer_matches_the_reference_model(
    n_envs: int, rollout_len: int | None, max_buffered: int | None, lag: int, version_stamp: str, ops: list[tuple]
) -> None:
    buffer = AgentEpisodeBuffer(n_envs, rollout_len, max_buffered, version_stamp)  # type: ignore[arg-type]
    reference = ReferenceBuffer(n_envs, rollout_len, max_buffered, version_stamp)
    version, next_id = 0, 1
    seen: list[int] = []
    drained: list[Trajectory] = []
    for op in ops:
        if op[0] == "step":
            kinds = op[1][:n_envs]
            ids = np.arange(next_id, next_id + n_envs)
            next_id += n_envs
            rows = np.arange(n_envs)
            acted = np.array([kind != "skip" for kind in kinds])
            terminated = np.array([kind == "terminate" for kind in kinds])
            truncated = np.array([kind.startswith("truncate") for kind in kinds])
            final_obs = {i: np.array([ids[i] + 0.5, i], dtype=np.float32) for i in rows if kinds[i] == "truncate"}
            obs = np.stack([ids, rows], axis=1).astype(np.float32)
            buffer.add(acted, obs, ids.copy(), ids.astype(np.float32), 10.0 * ids, -ids.astype(np.float32),
                       terminated, truncated, np.stack([-ids, rows], axis=1).astype(np.float32), final_obs, version, lag)
            for i in np.flatnonzero(acted):
                reference.add(int(i), int(ids[i]), version, bool(terminated[i]), bool(truncated[i]), i in final_obs, lag)
                seen.append(int(ids[i]))
        elif op[0] == "drain":
            _, n_episodes, n_steps = op
            batch = buffer.drain(n_episodes, n_steps, version, lag)
            expected = reference.drain(n_episodes, n_steps, version, lag)
            assert [describe(t) for t in batch] == [ref_describe(t) for t in expected]
            drained.extend(batch)
            if batch:
                version += 1  # an update happened
        else:
            env_idx = None if op[1] is None else min(op[1], n_envs - 1)
            assert buffer.drop_open(env_idx) == reference.drop_open(env_idx)

    assert [describe(t) for t in buffer.finished] == [ref_describe(t) for t in reference.finished]
    open_ids = {
        env_idx: [int(obs[0]) for obs in trajectory.observations]
        for env_idx, trajectory in enumerate(buffer._open)
        if trajectory is not None
    }
    assert open_ids == {env_idx: t.ids for env_idx, t in reference.open.items()}
    assert (buffer.stale_episodes_dropped, buffer.rejected_episodes) == (reference.stale, reference.rejected)

    # Whatever the reference says: nothing duplicated or mislabelled, every trajectory consecutive steps of a copy.
    kept = [*drained, *buffer.finished]
    for trajectory in kept:
        assert_labelled(trajectory)
    stored = [tid for t in kept for tid in describe(t)[0]] + [tid for ids in open_ids.values() for tid in ids]
    assert len(stored) == len(set(stored)) and set(stored) <= set(seen)
    steps_of_copy = {i: [tid for tid in seen if (tid - 1) % n_envs == i] for i in range(n_envs)}
    for trajectory in kept:
        ids, env_idx = describe(trajectory)[:2]
        start = steps_of_copy[env_idx].index(ids[0])
        assert steps_of_copy[env_idx][start : start + len(ids)] == ids, "a trajectory skips or reorders steps"


# ================================================================================================================
# The env layer
# ================================================================================================================

AGENTS = ("a0", "a1", "a2")
KINDS = ("terminated", "truncated", "vanish")  # vanish: the agent leaves without a flag and without a final obs


@dataclass(frozen=True)
class AgentScript:
    join: int | None  # the step after which the agent appears (0: at reset); None: never
    leave: int  # the step at which it leaves (> join; the episode's length at most)
    kind: str
    # A broken env (PettingZoo forbids it) brings the agent back into `agents` at this step; it must not act again.
    rejoin: int | None = None


@dataclass(frozen=True)
class EpisodeScript:
    length: int
    agents: tuple[AgentScript, ...]


def code(copy: int, episode: int, t: int, agent: int) -> float:
    """A transition's reward, which says whose it is."""
    return float(copy * 100_000 + episode * 1000 + t * 10 + agent)


class ScriptedEnv(ParallelEnv):
    """Plays episodes from a script, cyclically. Observation of agent ``k`` at step ``t`` of episode ``e`` of copy
    ``c``: ``[c, e, t, k]``; the reward of its action on it: ``code(c, e, t, k)``."""

    metadata: ClassVar[dict[str, Any]] = {"name": "scripted_v0", "render_modes": [], "is_parallelizable": True}

    def __init__(self, episodes: tuple[EpisodeScript, ...], copy: int) -> None:
        self.episodes = episodes
        self.copy = copy
        self.possible_agents = list(AGENTS)
        self.render_mode = None
        self._space = spaces.Box(-np.inf, np.inf, (4,), np.float32)
        self.agents: list[str] = []
        self.revived: set[str] = set()
        self.episode = -1
        self.t = 0

    def observation_space(self, agent: str) -> spaces.Space:
        return self._space

    def action_space(self, agent: str) -> spaces.Space:
        return spaces.Discrete(2)

    def script(self) -> EpisodeScript:
        return self.episodes[self.episode % len(self.episodes)]

    def _obs(self, agent: str) -> np.ndarray:
        return np.array([self.copy, self.episode, self.t, AGENTS.index(agent)], dtype=np.float32)

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        self.episode += 1
        self.t = 0
        self.revived = set()
        self.agents = [agent for agent, spec in zip(AGENTS, self.script().agents, strict=True) if spec.join == 0]
        return {agent: self._obs(agent) for agent in self.agents}, {agent: {} for agent in self.agents}

    def step(self, actions: dict[str, Any]) -> tuple[dict, dict, dict, dict, dict]:
        expected = set(self.agents) - self.revived
        assert set(actions) == expected, f"actions for {sorted(actions)}, live agents {sorted(expected)}"
        rewards = {agent: code(self.copy, self.episode, self.t, AGENTS.index(agent)) for agent in self.agents}
        self.t += 1
        specs = dict(zip(AGENTS, self.script().agents, strict=True))
        observations, terminations, truncations = {}, {}, {}
        staying = []
        for agent in self.agents:
            spec = specs[agent]
            if spec.leave == self.t and agent not in self.revived:
                if spec.kind != "vanish":
                    observations[agent] = self._obs(agent)
                    terminations[agent] = spec.kind == "terminated"
                    truncations[agent] = spec.kind == "truncated"
            else:
                staying.append(agent)
                observations[agent] = self._obs(agent)
                terminations[agent] = truncations[agent] = False
        joining = [agent for agent, spec in specs.items() if spec.join == self.t]
        rejoining = [agent for agent, spec in specs.items() if spec.rejoin == self.t and agent not in self.agents]
        self.revived.update(rejoining)
        for agent in joining + rejoining:
            observations[agent] = self._obs(agent)
            rewards[agent], terminations[agent], truncations[agent] = 0.0, False, False
        self.agents = staying + joining + rejoining
        infos: dict[str, dict] = {agent: {} for agent in observations}
        return observations, rewards, terminations, truncations, infos


@st.composite
def episode_scripts(draw: Any) -> EpisodeScript:
    length = draw(st.integers(1, 6))
    agents = []
    for index in range(len(AGENTS)):
        join = 0 if index == 0 else draw(st.one_of(st.none(), st.integers(0, length - 1)))
        leave = length if join is None else draw(st.integers(join + 1, length))
        can_rejoin = join is not None and leave + 1 <= length - 1
        rejoin = draw(st.one_of(st.none(), st.integers(leave + 1, length - 1))) if can_rejoin else None
        agents.append(AgentScript(join, leave, draw(st.sampled_from(KINDS)), rejoin))
    return EpisodeScript(length, tuple(agents))


@dataclass
class ReferenceCopy:
    """The rules of one env copy, simulated: who acts, what each transition says, when the episode ends."""

    episodes: tuple[EpisodeScript, ...]
    max_episode_steps: int | None
    copy: int
    episode: int = -1
    t: int = 0
    alive: list[str] = field(default_factory=list)

    def reset(self) -> None:
        self.episode += 1
        self.t = 0
        self.alive = [agent for agent, spec in zip(AGENTS, self.script().agents, strict=True) if spec.join == 0]

    def script(self) -> EpisodeScript:
        return self.episodes[self.episode % len(self.episodes)]

    def step(self) -> tuple[dict[str, tuple], bool]:
        """``({acting agent: (reward, terminated, truncated, final obs or None)}, episode done)``."""
        specs = dict(zip(AGENTS, self.script().agents, strict=True))
        self.t += 1
        time_limit = self.max_episode_steps is not None and self.t >= self.max_episode_steps
        transitions = {}
        staying = []
        for agent in self.alive:
            spec, k = specs[agent], AGENTS.index(agent)
            reward = code(self.copy, self.episode, self.t - 1, k)
            leaves = spec.leave == self.t
            terminated = leaves and spec.kind == "terminated"
            present = not leaves or spec.kind != "vanish"
            truncated = not terminated and (leaves or time_limit)
            final = (self.copy, self.episode, self.t, k) if present and (leaves or time_limit) else None
            transitions[agent] = (reward, terminated, truncated, final)
            if not leaves:
                staying.append(agent)
        joining = [agent for agent, spec in specs.items() if spec.join == self.t]
        self.alive = [] if time_limit else [agent for agent in AGENTS if agent in staying + joining]
        done = not self.alive
        if done:
            self.reset()
        return transitions, done


@PROPERTY_SETTINGS
@given(
    scripts=st.lists(st.lists(episode_scripts(), min_size=1, max_size=3), min_size=1, max_size=3),
    max_episode_steps=st.one_of(st.none(), st.integers(1, 6)),
    n_steps=st.integers(1, 25),
    rollout_len=st.one_of(st.none(), st.integers(1, 4)),
)
def test_env_layer_matches_the_reference_rules_and_buffers_keep_every_transition(
    scripts: list[list[EpisodeScript]], max_episode_steps: int | None, n_steps: int, rollout_len: int | None
) -> None:
    n_envs = len(scripts)
    vec_env = DummyMultiAgentVecEnv(
        [lambda episodes=tuple(episodes), copy=copy: ScriptedEnv(episodes, copy) for copy, episodes in enumerate(scripts)],
        max_episode_steps,
    )
    references = [ReferenceCopy(tuple(episodes), max_episode_steps, copy) for copy, episodes in enumerate(scripts)]
    buffers = {agent: AgentEpisodeBuffer(n_envs, rollout_len) for agent in AGENTS}
    obs = vec_env.reset()
    for reference in references:
        reference.reset()
    acted_transitions: set[tuple] = set()
    for _ in range(n_steps):
        alive = vec_env.alive
        for env_idx, reference in enumerate(references):
            assert [agent for agent in AGENTS if alive[agent][env_idx]] == reference.alive
            for agent in reference.alive:
                assert obs[agent][env_idx].tolist() == [env_idx, reference.episode, reference.t, AGENTS.index(agent)]
        step = vec_env.step_agents({agent: np.zeros(n_envs, dtype=np.int64) for agent in AGENTS})
        for env_idx, reference in enumerate(references):
            episode = reference.episode
            transitions, done = reference.step()
            assert step.dones[env_idx] == done and ("episode" in step.infos[env_idx]) == done
            for agent in AGENTS:
                if agent not in transitions:
                    continue
                reward, terminated, truncated, final = transitions[agent]
                where = f"copy {env_idx}, agent {agent}, episode {episode}, step {reference.t}"
                assert step.rewards[agent][env_idx] == reward, where
                assert (step.terminations[agent][env_idx], step.truncations[agent][env_idx]) == (terminated, truncated), where
                got_final = step.final_obs[agent].get(env_idx)
                assert (None if got_final is None else tuple(got_final.tolist())) == final, where
                acted_transitions.add((env_idx, agent, reward))
        for agent in AGENTS:
            rows = alive[agent]
            buffers[agent].add(rows, obs[agent], np.zeros(n_envs, dtype=np.int64), step.rewards[agent], np.zeros(n_envs),
                               np.zeros(n_envs), step.terminations[agent], step.truncations[agent], step.obs[agent],
                               step.final_obs[agent], 0)
        obs = step.obs

    # Every transition lands once, in a trajectory that is an unbroken piece of one agent's episode in one copy,
    # each step with its own reward.
    stored: list[tuple] = []
    for agent, buffer in buffers.items():
        k = AGENTS.index(agent)
        pieces = [(t.observations, t.rewards, t) for t in buffer.finished]
        pieces += [(np.stack(o.observations), np.array(o.rewards), None) for o in buffer._open if o is not None]
        for observations, rewards, trajectory in pieces:
            copies, episodes, steps, agents = observations.T.astype(int)
            assert len(set(copies.tolist())) == 1 and len(set(episodes.tolist())) == 1 and set(agents.tolist()) == {k}
            assert steps.tolist() == list(range(steps[0], steps[0] + len(steps))), "a trajectory skips or reorders steps"
            expected = [code(c, e, t, k) for c, e, t in zip(copies, episodes, steps, strict=True)]
            np.testing.assert_array_equal(rewards, expected)
            if trajectory is not None and trajectory.bootstrap_obs is not None:
                # The next observation (final, or after a rollout_len cut), or the last one (the agent vanished).
                assert trajectory.bootstrap_obs.tolist()[:3] in ([copies[0], episodes[0], steps[-1] + 1],
                                                                  [copies[0], episodes[0], steps[-1]])
            stored.extend((int(copies[0]), agent, float(reward)) for reward in rewards)
    assert len(stored) == len(set(stored)), "a transition is stored twice"
    assert set(stored) == acted_transitions, "a transition is lost, or stored that never happened"
