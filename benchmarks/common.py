"""Shared setup of the benchmarks that compare IPPO with its usual alternative.

The peer is SB3's ``PPO`` with one network shared by every agent through SuperSuit: each agent of each env copy is
one entry of an SB3 ``VecEnv`` (``pettingzoo_env_to_vec_env_v1`` then ``concat_vec_envs_v1``), so with 8 copies of a
3-agent env the peer sees a ``VecEnv`` of 24 entries. Agents with different spaces (``simple_adversary_v3``) are
padded first (``pad_observations_v0``, ``pad_action_space_v0``), as SuperSuit's documentation advises.

Counting: IPPO's ``num_timesteps`` counts env steps (one joint step of one copy = 1); the peer's counts agent-steps
(one per ``VecEnv`` entry per step). Everything these benchmarks report is converted to env steps or agent-steps
(env steps x agents) explicitly.

Every benchmark process runs torch on one thread (``set_torch_threads``): the benchmark machine has 2 cores shared
with other jobs, and one thread per process keeps the two algorithms on equal terms.
"""

from __future__ import annotations

import csv
import os
import platform
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import supersuit as ss
import torch as th
from mpe2 import simple_adversary_v3, simple_spread_v3
from pettingzoo import ParallelEnv
from stable_baselines3 import PPO
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.vec_env import VecEnv
from supersuit.vector.sb3_vector_wrapper import SB3VecEnvWrapper

from sb3_ippo import make_vec_env
from sb3_ippo.vec_env import MultiAgentVecEnv

ENV_MODULES = {"simple_spread_v3": simple_spread_v3, "simple_adversary_v3": simple_adversary_v3}
ENV_KWARGS: dict[str, dict[str, Any]] = {
    "simple_spread_v3": {"N": 3, "max_cycles": 25},
    "simple_adversary_v3": {"N": 2, "max_cycles": 25},
}
NET_ARCH = [64, 64]


def set_torch_threads(n_threads: int = 1) -> None:
    """One torch thread per process (see the module docstring)."""
    th.set_num_threads(n_threads)


def machine_description() -> str:
    """One line: CPU, core count, load, Python and library versions."""
    import gymnasium
    import pettingzoo
    import stable_baselines3

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            cpu = next(line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return (
        f"{cpu}, {os.cpu_count()} CPUs, load {load:.1f}; Python {platform.python_version()}, torch {th.__version__} "
        f"({th.get_num_threads()} thread), SB3 {stable_baselines3.__version__}, PettingZoo {pettingzoo.__version__}, "
        f"gymnasium {gymnasium.__version__}, SuperSuit {ss.__version__ if hasattr(ss, '__version__') else '3.x'}"
    )


def write_results(out: Path, stem: str, text: str, rows: Sequence[dict[str, Any]]) -> None:
    """Write a benchmark's printed table to ``out/stem.txt`` and its rows to ``out/stem.csv``."""
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.txt").write_text(text + "\n")
    with open(out / f"{stem}.csv", "w", newline="") as file:
        writer = csv.DictWriter(file, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def env_fn(env_name: str) -> Callable[..., ParallelEnv]:
    return ENV_MODULES[env_name].parallel_env


def env_kwargs(env_name: str, n_agents: int | None = None) -> dict[str, Any]:
    """The benchmark's env arguments; ``n_agents`` overrides simple_spread's N (the scaling benchmark)."""
    kwargs = dict(ENV_KWARGS[env_name])
    if n_agents is not None:
        assert env_name == "simple_spread_v3", "only simple_spread scales its number of agents"
        kwargs["N"] = n_agents
    return kwargs


def agent_ids(env_name: str, kwargs: dict[str, Any]) -> list[str]:
    return list(env_fn(env_name)(**kwargs).possible_agents)


def make_ippo_env(
    env_name: str, n_envs: int, seed: int, kwargs: dict[str, Any], vec_env_cls: str = "dummy"
) -> MultiAgentVecEnv:
    """IPPO's vectorized env: ``n_envs`` copies, in-process unless ``vec_env_cls="subproc"``."""
    return make_vec_env(env_fn(env_name), n_envs=n_envs, seed=seed, vec_env_cls=vec_env_cls, env_kwargs=kwargs)


def make_peer_env(env_name: str, n_envs: int, seed: int, kwargs: dict[str, Any]) -> VecEnv:
    """The peer's SB3 ``VecEnv``: every agent of every copy is one entry, copy ``c``'s agents at ``c*n .. c*n+n-1``.

    In-process copies (``num_cpus=0``), as IPPO's ``"dummy"`` vec env.
    """
    return peer_vec_env(env_fn(env_name)(**kwargs), n_envs, seed)


def peer_vec_env(env: ParallelEnv, n_envs: int, seed: int) -> VecEnv:
    """``make_peer_env`` for any parallel env: padded, one ``VecEnv`` entry per agent of each of ``n_envs`` copies."""
    env = ss.pad_observations_v0(env)
    env = ss.pad_action_space_v0(env)
    vec_env = ss.pettingzoo_env_to_vec_env_v1(env)
    vec_env = ss.concat_vec_envs_v1(vec_env, n_envs, num_cpus=0, base_class="stable_baselines3")
    vec_env = SeedableSB3VecEnv(vec_env.venv)
    vec_env.seed(seed)
    return vec_env


class SeedableSB3VecEnv(SB3VecEnvWrapper):
    """SuperSuit's SB3 wrapper, plus the ``seed`` SB3's ``PPO(seed=...)`` calls (SuperSuit 3.11's ``ConcatVecEnv`` has
    none, so ``PPO(..., seed=0)`` raises AttributeError): the seed goes to the next reset, as in SB3's own VecEnvs."""

    _pending_seed: int | None = None

    def seed(self, seed: int | None = None) -> list[int | None]:  # type: ignore[override]
        self._pending_seed = seed
        return [seed] * self.num_envs

    def reset(self, seed: int | None = None, options: dict | None = None) -> Any:  # type: ignore[override]
        seed, self._pending_seed = (seed if seed is not None else self._pending_seed), None
        observations, self.reset_infos = self.venv.reset(seed=seed, options=options)
        return observations


def make_peer(env: VecEnv, seed: int, policy: str = "MlpPolicy", **hyperparameters: Any) -> PPO:
    if policy == "MlpPolicy":
        hyperparameters.setdefault("policy_kwargs", {"net_arch": NET_ARCH})
    return PPO(policy, env, seed=seed, device="cpu", **hyperparameters)


class EpisodeRecorder(BaseCallback):
    """Records every finished training episode: env steps so far, team return and each agent's return.

    Works for both algorithms: for IPPO it reads the episode statistics ``MultiAgentVecEnv`` puts in ``infos``;
    for the peer it sums each ``VecEnv`` entry's rewards and closes a copy's episode when its agents are done
    (in MPE every agent of a copy finishes in the same step).
    """

    def __init__(self, agents: list[str], peer: bool) -> None:
        super().__init__()
        self.agents = agents
        self.peer = peer
        self.episodes: list[dict[str, float]] = []
        self._returns: np.ndarray | None = None
        self.start_time = time.perf_counter()

    def _on_training_start(self) -> None:
        # The clock covers ``learn`` only, not building the model.
        self.start_time = time.perf_counter()

    def env_steps(self) -> int:
        return self.num_timesteps // len(self.agents) if self.peer else self.num_timesteps

    def _on_step(self) -> bool:
        if self.peer:
            self._record_peer(np.asarray(self.locals["rewards"], dtype=np.float64), np.asarray(self.locals["dones"]))
        else:
            for info in self.locals["infos"]:
                if "episode" in info:
                    agent_returns = info["episode"]["agent_returns"]
                    self._add({agent: float(agent_returns.get(agent, 0.0)) for agent in self.agents})
        return True

    def _record_peer(self, rewards: np.ndarray, dones: np.ndarray) -> None:
        n_agents = len(self.agents)
        if self._returns is None:
            self._returns = np.zeros_like(rewards)
        self._returns += rewards
        per_copy_done = dones.reshape(-1, n_agents)
        per_copy_returns = self._returns.reshape(-1, n_agents)
        for copy_idx in np.flatnonzero(per_copy_done.all(axis=1)):
            self._add(dict(zip(self.agents, per_copy_returns[copy_idx].tolist(), strict=True)))
            per_copy_returns[copy_idx] = 0.0

    def _add(self, agent_returns: dict[str, float]) -> None:
        record = {"env_steps": float(self.env_steps()), "seconds": time.perf_counter() - self.start_time}
        record["team_return"] = float(sum(agent_returns.values()))
        record.update({f"return/{agent}": value for agent, value in agent_returns.items()})
        self.episodes.append(record)


def evaluate_peer(model: PPO, env_name: str, kwargs: dict[str, Any], n_episodes: int, seed: int, deterministic: bool) -> dict:
    """Team and per-agent returns of the peer over ``n_episodes`` episodes of one raw copy (padded as in training)."""
    env = ss.pad_action_space_v0(ss.pad_observations_v0(env_fn(env_name)(**kwargs)))
    return evaluate_model(model, env, n_episodes, seed, deterministic, stacked=True)


def evaluate_ippo(model: Any, env_name: str, kwargs: dict[str, Any], n_episodes: int, seed: int, deterministic: bool) -> dict:
    env = env_fn(env_name)(**kwargs)
    return evaluate_model(model, env, n_episodes, seed, deterministic, stacked=False)


def evaluate_model(model: Any, env: ParallelEnv, n_episodes: int, seed: int, deterministic: bool, stacked: bool) -> dict:
    """``evaluate_ippo`` (``stacked=False``) or ``evaluate_peer`` (``stacked=True``, ``env`` padded) on a given env."""
    return evaluate_episodes(lambda obs: model.predict(obs, deterministic=deterministic)[0], env, n_episodes, seed, stacked)


def evaluate_random(env_name: str, kwargs: dict[str, Any], n_episodes: int, seed: int) -> dict:
    return evaluate_random_env(env_fn(env_name)(**kwargs), n_episodes, seed)


def evaluate_random_env(env: ParallelEnv, n_episodes: int, seed: int) -> dict:
    """``evaluate_random`` on a given parallel env."""
    env.reset(seed=seed)
    for agent in env.possible_agents:
        env.action_space(agent).seed(seed)
    return evaluate_episodes(None, env, n_episodes, seed, stacked=False)


def evaluate_episodes(act: Callable[[Any], Any] | None, env: ParallelEnv, n_episodes: int, seed: int, stacked: bool) -> dict:
    """Run episodes on one copy. ``act`` maps the agents' observations, stacked in one array (the peer: one network
    for all) or as a dict (IPPO), to their actions; None: random actions."""
    totals: dict[str, list[float]] = defaultdict(list)
    for episode in range(n_episodes):
        obs, _ = env.reset(seed=seed + episode)
        returns = dict.fromkeys(env.possible_agents, 0.0)
        while env.agents:
            agents = list(env.agents)
            if act is None:
                actions = {agent: env.action_space(agent).sample() for agent in agents}
            elif stacked:
                actions = dict(zip(agents, act(np.stack([obs[agent] for agent in agents])), strict=True))
            else:
                actions = act({agent: obs[agent] for agent in agents})
            obs, rewards, _, _, _ = env.step({agent: python_action(actions[agent]) for agent in agents})
            for agent, reward in rewards.items():
                returns[agent] += float(reward)
        totals["team_return"].append(sum(returns.values()))
        for agent, value in returns.items():
            totals[f"return/{agent}"].append(value)
    return {key: float(np.mean(values)) for key, values in totals.items()}


def python_action(action: Any) -> Any:
    # mpe2 steps faster on Python ints than on numpy integers.
    return action.item() if isinstance(action, np.ndarray) and action.ndim == 0 else action
