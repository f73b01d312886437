"""One env copy: a PettingZoo parallel env that tracks its alive agents and episode statistics and resets itself at the
end of each episode, and the steps, resets and rebuilds that every kind of vectorized env (in this process, in worker
processes, in Ray actors) applies to its copies, with an env's exception turned into a :class:`CopyFailure`.
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import gymnasium as gym
from pettingzoo import AECEnv, ParallelEnv
from pettingzoo.utils.conversions import aec_to_parallel
from stable_baselines3.common.vec_env.base_vec_env import VecEnv

from sb3_ippo.common.type_aliases import AgentID


def is_parallel_env(env: Any) -> bool:
    """A PettingZoo ``ParallelEnv``, or an object with its interface (some wrappers do not subclass it)."""
    if isinstance(env, ParallelEnv):
        return True
    if isinstance(env, (AECEnv, gym.Env, VecEnv)):
        return False
    return all(hasattr(env, name) for name in ("possible_agents", "reset", "step")) and callable(
        getattr(env, "observation_space", None)
    )


def to_parallel_env(env: Any) -> ParallelEnv:
    """Return ``env`` as a PettingZoo ``ParallelEnv``, converting an AEC env where the env allows it.

    :raises ValueError: for an AEC env that PettingZoo cannot run in parallel.
    :raises TypeError: for anything that is not a PettingZoo env.
    """
    if hasattr(env, "num_envs") and not isinstance(env, (ParallelEnv, AECEnv, gym.Env, VecEnv)):
        raise TypeError(
            f"{type(env).__name__} steps {env.num_envs} copies at once (a natively batched env), not one: IPPO takes it as "
            "it is (IPPO(policy, env), or make_vec_env(env_fn, n_envs, vec_env_cls='batched')), but what needs one "
            "PettingZoo env per copy (MAPPO's critic input, PettingZoo or SuperSuit wrappers) does not."
        )
    if is_parallel_env(env):
        return env
    if isinstance(env, AECEnv):
        if not env.metadata.get("is_parallelizable", False):
            # PettingZoo's own advice (set is_parallelizable) is wrong for a game whose agents take turns.
            name = env.metadata.get("name", type(env.unwrapped).__name__)
            raise ValueError(
                f"The AEC environment {name} is turn-based (its metadata does not set is_parallelizable), so it "
                "cannot be converted to a parallel environment. make_vec_env(env_fn) and IPPO(policy, env) step such envs "
                "turn by turn (sb3_ippo.games.turn_based)."
            )
        return aec_to_parallel(env)
    if isinstance(env, str):
        raise TypeError(
            f"Got the string {env!r}; sb3_ippo needs a PettingZoo environment instance, "
            "e.g. `simple_spread_v3.parallel_env()` from mpe2, or `make_vec_env(simple_spread_v3.parallel_env, n_envs=4)`."
        )
    if isinstance(env, gym.Env):
        raise TypeError(
            f"Got the gymnasium env {env}; sb3_ippo trains PettingZoo multi-agent environments (ParallelEnv or AECEnv). "
            "For a single-agent gymnasium env, use stable_baselines3.PPO."
        )
    if callable(env):
        kind = "class" if isinstance(env, type) else "function"
        name = getattr(env, "__qualname__", "")
        label = f"the {kind} {name}" if name and "<" not in name else f"a {kind}"  # not "<locals>.par_fn"
        raise TypeError(
            f"Got {label}, not an environment: call it to make one, e.g. "
            "`IPPO('MlpPolicy', simple_spread_v3.parallel_env())`, or pass the function to make_vec_env, e.g. "
            "`make_vec_env(simple_spread_v3.parallel_env, n_envs=8)`."
        )
    raise TypeError(f"Expected a PettingZoo ParallelEnv or AECEnv, got {type(env).__name__}: {env!r}")


class EpisodeCopy:
    """One copy of the parallel env: it tracks alive agents and episode statistics, and resets itself at episode end."""

    def __init__(self, env: ParallelEnv, max_episode_steps: int | None = None) -> None:
        self.env = env
        self.max_episode_steps = max_episode_steps
        # Ordered like env.agents (a dict, not a set), so that sums over agents, such as the team return, do not
        # depend on the process's string hashing: the same seed gives the same data in every worker process.
        self.alive: dict[AgentID, None] = {}
        # Agents that left the current episode: they are never revived before the next reset.
        self.finished: set[AgentID] = set()
        self.episode_length = 0
        self.team_return = 0.0
        self.agent_returns: dict[AgentID, float] = {}
        self.episode_start = time.time()

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        obs, infos = self.env.reset(seed=seed, options=options or None)
        self.alive = dict.fromkeys(agent for agent in self.env.agents if agent in obs)
        self.finished = set()
        self.episode_length = 0
        self.team_return = 0.0
        self.agent_returns = {agent: 0.0 for agent in self.env.possible_agents}
        self.episode_start = time.time()
        return obs, infos

    def step(self, actions: dict[AgentID, Any]) -> CopyStep:
        """Step the alive agents. When no agent is left the episode is done, and the caller resets the copy
        (:func:`step_copy`)."""
        acting = self.alive
        obs, rewards, terminations, truncations, infos = self.env.step(
            {agent: action for agent, action in actions.items() if agent in acting}
        )
        self.episode_length += 1
        time_limit = self.max_episode_steps is not None and self.episode_length >= self.max_episode_steps
        terminations = {agent: bool(terminations.get(agent, False)) for agent in acting}
        truncations = {agent: bool(truncations.get(agent, False)) for agent in acting}
        new_alive: dict[AgentID, None] = {}
        if not time_limit:
            new_alive = dict.fromkeys(
                agent
                for agent in self.env.agents
                if agent in obs and agent not in self.finished and not terminations.get(agent) and not truncations.get(agent)
            )
        leaving = [agent for agent in acting if agent not in new_alive]
        for agent in leaving:
            # An agent that leaves without a termination flag (time limit, or dropped by the env) is truncated:
            # its trajectory did not reach a terminal state.
            if not terminations[agent]:
                truncations[agent] = True
        self.finished.update(leaving)
        self.alive = new_alive
        rewards = {agent: float(rewards.get(agent, 0.0)) for agent in acting}
        for agent, reward in rewards.items():
            self.agent_returns[agent] += reward
        self.team_return += sum(rewards.values())
        final_obs = {agent: obs.get(agent) for agent in leaving}
        done = not self.alive
        episode = None
        if done:
            episode = {
                "r": self.team_return,
                "l": self.episode_length,
                "t": round(time.time() - self.episode_start, 6),
                "agent_returns": dict(self.agent_returns),
            }
        return CopyStep(obs, rewards, terminations, truncations, infos, self.alive, done, final_obs, episode)


class CopyStep(NamedTuple):
    """One copy's step: obs, rewards, terminations, truncations, infos, alive agents, whether the episode is done
    (then ``obs`` and ``alive`` are those of the next episode's reset), final obs of the agents that left, episode
    statistics."""

    obs: dict
    rewards: dict
    terminations: dict
    truncations: dict
    infos: dict
    alive: dict
    done: bool
    final_obs: dict
    episode: dict | None


class CopyFailure(NamedTuple):
    """An env copy that raised. ``phase``: "step", "reset" (the reset after a finished step, whose result is kept
    in ``step_result``), or "restart" (the rebuild of a failed copy). ``error`` is the exception itself in this
    process, None when it comes from a worker process (only its traceback text travels)."""

    phase: str
    traceback: str
    step_result: CopyStep | None = None
    error: BaseException | None = None


def step_copy(episode_copy: EpisodeCopy, actions: dict[AgentID, Any], keep_error: bool) -> CopyStep | CopyFailure:
    """Step one copy and reset it at the end of its episode; an exception of the env becomes a :class:`CopyFailure`."""
    try:
        result = episode_copy.step(actions)
    except Exception as error:
        return CopyFailure("step", traceback.format_exc(), None, error if keep_error else None)
    if result.done:
        try:
            obs, _ = episode_copy.reset()
        except Exception as error:
            return CopyFailure("reset", traceback.format_exc(), result, error if keep_error else None)
        result = result._replace(obs=obs, alive=episode_copy.alive)
    return result


def reset_copy(
    episode_copy: EpisodeCopy, seed: int | None, options: dict | None, keep_error: bool
) -> tuple[dict, dict, dict] | CopyFailure:
    """Reset one copy: ``(obs, infos, alive)``; an exception of the env becomes a :class:`CopyFailure`."""
    try:
        obs, infos = episode_copy.reset(seed=seed, options=options)
    except Exception as error:
        return CopyFailure("reset", traceback.format_exc(), None, error if keep_error else None)
    return obs, infos, episode_copy.alive


def parallel_copy(env: Any, max_episode_steps: int | None = None) -> EpisodeCopy:
    """A copy of ``env`` (a parallel env, or an AEC env PettingZoo can run in parallel)."""
    return EpisodeCopy(to_parallel_env(env), max_episode_steps)


def rebuild_copy(
    copies: list[EpisodeCopy],
    env_fns: Sequence[Callable[[], Any]],
    index: int,
    seed: int | None,
    keep_error: bool,
    make_copy: Callable[[Any, int | None], EpisodeCopy] = parallel_copy,
) -> tuple[dict, dict, dict] | CopyFailure:
    """Replace ``copies[index]`` by ``make_copy`` of a new env from ``env_fns[index]``, reset with ``seed``:
    ``(obs, infos, alive)``."""
    old = copies[index]
    try:
        old.env.close()
    except Exception:  # the env failed already: its close may fail too
        pass
    try:
        new = make_copy(env_fns[index](), old.max_episode_steps)
        copies[index] = new
        obs, infos = new.reset(seed=seed)
    except Exception as error:
        return CopyFailure("restart", traceback.format_exc(), None, error if keep_error else None)
    return obs, infos, new.alive


class Rebuilt(NamedTuple):
    """A failed copy, rebuilt and reset: its reset's obs, infos and alive agents, and why it was rebuilt."""

    obs: dict
    infos: dict
    alive: dict
    error: str


class Resolved(NamedTuple):
    """A copy's step result once failures are handled: the result, the failure's traceback if the copy was
    restarted, and whether its episode in progress was lost."""

    result: CopyStep
    restart_error: str | None
    episode_lost: bool


def lost_episode(rebuilt: Rebuilt) -> Resolved:
    """The step result of a copy whose episode was lost: no transition, the copy reset (done), no episode statistics."""
    return Resolved(CopyStep(rebuilt.obs, {}, {}, {}, {}, rebuilt.alive, True, {}, None), rebuilt.error, True)
