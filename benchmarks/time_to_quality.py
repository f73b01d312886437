"""Time to quality: team return against wall-clock seconds and env steps, IPPO against its alternatives, on a suite.

For each task of the suite and each seed, every algorithm trains for the task's budget of env steps (one joint step
of one copy = 1) while each finished training episode is recorded with the env steps and the wall-clock seconds
since the start of ``learn`` (``time.perf_counter``; ``common.EpisodeRecorder`` for IPPO and the peer, the
``EpisodeClock`` env wrapper for skrl). After training, each model is evaluated with deterministic actions.

The algorithms (``--algos``):

- ``ippo``: IPPO with its defaults, as ``IPPO(policy, env, seed=seed)`` gives them (``docs/hyperparameters.md``;
  since issue 32 SB3's cadence and update, synchronous, with rollouts that end with the episodes where they can); for
  screens, any IPPO variant of the learning comparison (``benchmarks/learning.py``'s ``IPPO_VARIANTS``, e.g.
  ``ippo_cut``: the defaults with every rollout cut at 128 steps, or ``ippo_before32``: the defaults before issue 32).
- ``mappo``: MAPPO (``sb3_ippo.MAPPO``) at IPPO's defaults with ``critic_input="state"`` (the env's ``state()``):
  the same actors, a centralized critic (``docs/algorithm.md``, "IPPO or MAPPO"). Not run where the policy is not
  an MLP (pistonball). ``--ippo-timesteps`` applies to it as to the IPPO rows.
- ``peer``: SB3 ``PPO`` + SuperSuit parameter sharing (``benchmarks/common.py``), configured as in the learning
  comparison (``benchmarks/learning.py``): SB3's defaults except ``n_steps=256`` per ``VecEnv`` entry and
  ``batch_size=256``; 64x64 MLPs (SB3's own default) or SB3's untouched CnnPolicy.
- ``peer_sb3_defaults``: the same peer with SB3's untouched PPO defaults (``n_steps=2048``, ``batch_size=64``).
- ``skrl``: skrl's IPPO (``benchmarks/throughput.py``'s ``SkrlIPPO``, 64x64 MLPs) on one env copy (skrl's
  PettingZoo wrapper does not vectorize), given the peer's work per update: ``rollouts = 256 x n_envs`` steps,
  10 epochs, minibatches of 256, learning rate 3e-4, no KL stop. skrl rather than BenchMARL: skrl is already a dev
  dependency and installs beside torch on CPU; BenchMARL needs TorchRL's PettingZoo env and its own task configs,
  and its versions pin torch. Not on pistonball: skrl flattens image observations, a CNN would have to be written.

- ``env`` (``--throughput`` only; learning runs skip it): the env layer alone, IPPO's vec env on the same copies
  stepped with random actions drawn beforehand. IPPO's rate divided by this one (``x env``) is how close learning
  comes to its physical limit, where acting and updating would cost nothing (issue 32).

All run ``n_envs`` copies in-process (IPPO's ``"dummy"`` vec env; the peer's ``concat_vec_envs_v1(num_cpus=0)``)
and one torch thread per process (IPPO's learner process, where it has one, included).

The figures (printed as one table, task x algorithm; ``summary.csv``), each from the training curves of the run
itself unless said otherwise:

- **equal env steps**: the mean training-episode return over the last 10% of the task's budget, (0.9 B, B].
- **equal wall-clock time**: T is the peer's (``peer`` row, the learning comparison's configuration) wall-clock time
  for its full budget, per seed. Each algorithm's figure is read as the equal-steps one, over the last 10% of the env
  steps S_T it had reached at T (the env steps of its last episode ended by T, printed beside): the mean return of
  its episodes that ended in (0.9 S_T, S_T]. An algorithm that finished its budget before T is read at its end
  (marked ``<``: it had no more steps to give in T). With the peer as the reference the question answered is "what
  does IPPO give in the time the usual alternative takes"; the slowest algorithm's time would flatter the slow.
- **equal time (rates)**, with ``--rates``: the env steps S = B x (algorithm's steps/s) / (peer's steps/s) that the
  algorithm makes in the peer's time for the budget B, the rates taken from a ``throughput.csv`` of ``--throughput``
  (alternating rounds on an idle machine); the figure is read as the equal-steps one over (0.9 S, S]. Env-step
  curves do not depend on timing (IPPO's learner process applies updates at fixed points), so this figure stays true
  for runs that shared the machine. Give IPPO a budget past B (``--ippo-timesteps``) for S to fall inside its run;
  a run that stopped short of S is read at its end (marked ``<``).
- **eval**: the final model's deterministic evaluation (``--eval-episodes`` episodes), after its own budget.
- simple_adversary is scored for its good agents (summed); its eval is cross-play with the opponent held fixed
  (``benchmarks/cross_play.py``'s ``play``): every algorithm's good agents against the ``peer``'s adversary of the
  same seed (for the peer's own row: the adversary it trained with), and the ``eval adv.`` column: every algorithm's
  adversary against the ``peer``'s good agents.

Because the machine is shared, wall-clock figures of runs that did not run alone are noisy: ``--throughput``
measures env steps/s of every algorithm side by side in alternating rounds (fresh models, median over rounds), which
is the figure to quote for speed; the wall-clock curves show where the time went. Each ``--throughput`` round is one
``learn`` of ``--throughput-steps`` (default 30,000): at least 20,000, so that IPPO rows on
``async_training="auto"`` (``ippo``, and the variants that do not set it) run as a full-budget run does, with a
learner process on a machine with a second core; below 20,000 they would update in the training process.

The suite (``TASKS``; budgets are per-task defaults): mpe2 simple_spread_v3 (N=3), simple_speaker_listener_v4
(heterogeneous spaces: the peer pads), simple_adversary_v3 (N=2), sisl waterworld_v4 when the installed PettingZoo
has it (PettingZoo 1.27 removed it; sisl multiwalker_v9 is the continuous stand-in), sisl pursuit (v4 or v5,
8 pursuers), butterfly pistonball_v6 with CnnPolicy (4 pistons, discrete, ``examples/pistonball_cnn.py``'s
color_reduction + resize 48x48 + frame_stack 3). Each task has a random-policy baseline in the table. Outside the
suite, run only when named: simple_spread_v3_n10 (N=10), for the throughput at ten agents; simple_spread_v3_box
(N=3 with mpe2's ``continuous_actions=True``: Box actions in [0, 1]) and simple_speaker_listener_v4_box (the same for
speaker-listener), for continuous actions on short episodes; pistonball_v6_box (pistonball's own Box(-1, 1) actions).

    python benchmarks/time_to_quality.py [--tasks simple_spread_v3 ...] [--algos ippo peer peer_sb3_defaults skrl]
        [--seeds 1] [--timesteps N] [--ippo-timesteps N] [--rates throughput.csv] [--out runs/time_to_quality] [--smoke]
    python benchmarks/time_to_quality.py --throughput [--rounds 3] [--throughput-steps 30000] [--tasks ...]

Writes to ``--out``: ``runs/<task>_<algo>_seed<S>.csv`` (one row per training episode: algo, task, seed, episode,
env_steps, wall_seconds, episode_return, return/<agent>...), ``summary.csv``, ``time_to_quality.txt`` (the table),
``time_to_quality_<task>.png`` (return against seconds and against env steps), with ``--throughput``
``throughput.csv`` and ``throughput.txt``.
"""

from __future__ import annotations

import argparse
import csv
import importlib
import importlib.util
import json
import os
import statistics
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

# pygame (under pistonball) needs no display with the dummy video driver.
os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
os.environ.setdefault("PYGAME_HIDE_SUPPORT_PROMPT", "1")

import numpy as np
from pettingzoo import ParallelEnv
from pettingzoo.utils import BaseParallelWrapper
from supersuit.utils.action_transforms import homogenize_ops

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))
import common
import cross_play
import learning
from throughput import SkrlIPPO

from sb3_ippo import IPPO, MAPPO, make_vec_env

# IPPO's rows: its defaults ("ippo") and the variants of the learning comparison (benchmarks/learning.py), for screens.
IPPO_ALGOS = tuple(learning.IPPO_VARIANTS)
ALGOS = (*IPPO_ALGOS, "mappo", "peer", "peer_sb3_defaults", "skrl", "env")
DEFAULT_ALGOS = ("ippo", "peer", "peer_sb3_defaults", "skrl")
# The learning comparison's peer (benchmarks/learning.py: --peer-n-steps 256, --peer-batch-size 256); the rest SB3's.
PEER_SETTINGS: dict[str, dict[str, Any]] = {
    "peer": {"n_steps": 256, "batch_size": 256},
    "peer_sb3_defaults": {},
}
# skrl gets the learning comparison peer's work per update (see the module docstring).
SKRL_N_EPOCHS, SKRL_BATCH_SIZE = 10, 256
LABELS = {
    **{algo: learning.LABELS[algo] for algo in IPPO_ALGOS},
    "ippo": "IPPO (sb3_ippo defaults)",
    "mappo": "MAPPO (sb3_ippo, IPPO's defaults, critic_input='state')",
    "peer": "SB3 PPO + SuperSuit (n_steps 256/entry, batch 256)",
    "peer_sb3_defaults": "SB3 PPO + SuperSuit (SB3 defaults: n_steps 2048, batch 64)",
    "skrl": "skrl IPPO (1 copy, rollouts 256 x n_envs, 10 epochs, batch 256)",
    "env": "the env layer alone: IPPO's vec env, same copies, random actions, no learning (--throughput only)",
}
COLORS = {
    **{algo: learning.COLORS[algo] for algo in IPPO_ALGOS},
    "mappo": "tab:purple",
    "peer": "tab:orange",
    "peer_sb3_defaults": "tab:red",
    "skrl": "tab:green",
    "env": "tab:gray",
}
# The smoke run's peer: an update after 25 steps of each entry, in minibatches of 50 (the benchmark tests' TINY).
SMOKE_PEER = {"n_steps": 25, "batch_size": 50}


def label(algo: str, smoke: bool) -> str:
    """The configuration named beside every figure (``--smoke`` shrinks the peer's and skrl's rollouts)."""
    if smoke and algo not in (*IPPO_ALGOS, "mappo", "env"):
        return f"{LABELS[algo]}; --smoke: n_steps {SMOKE_PEER['n_steps']}/entry, batch {SMOKE_PEER['batch_size']}"
    return LABELS[algo]


def sisl_env(*names: str) -> Callable[..., ParallelEnv]:
    """The first of the sisl env modules ``names`` that the installed PettingZoo has (its ``parallel_env``)."""
    for name in names:
        if importlib.util.find_spec(f"pettingzoo.sisl.{name}") is not None:
            return importlib.import_module(f"pettingzoo.sisl.{name}").parallel_env
    raise ImportError(f"none of pettingzoo.sisl.{', '.join(names)} is installed")


def make_pistonball(**env_kwargs: Any) -> ParallelEnv:
    from pistonball_cnn import make_pistonball as example_pistonball

    return example_pistonball(**env_kwargs)


def mpe(name: str) -> Callable[..., ParallelEnv]:
    return lambda **kwargs: importlib.import_module(f"mpe2.{name}").parallel_env(**kwargs)


@dataclass(frozen=True)
class Task:
    """One task of the suite: how to build one copy, its budget and how it is scored."""

    make_env: Callable[..., ParallelEnv]
    env_kwargs: dict[str, Any]
    timesteps: int  # the default budget of env steps
    n_envs: int = 8
    policy: str = "MlpPolicy"
    smoke_env_kwargs: dict[str, Any] = field(default_factory=dict)  # overrides for --smoke (shorter episodes)
    skrl: bool = True
    cross_play: bool = False  # simple_adversary: scored by its good agents, evaluated against a fixed opponent
    anchor: str = ""  # a published figure in our reward convention, from the project's docs only
    suite: bool = True  # False: run only when named (--tasks), e.g. simple_spread at N=10 for --throughput

    def kwargs(self, smoke: bool) -> dict[str, Any]:
        return {**self.env_kwargs, **(self.smoke_env_kwargs if smoke else {})}


# Published anchor for simple_spread, converted to our team return in docs/benchmarks.md (the original MPE's shared
# reward OP is about (OP + 75) / 2 of ours). No other task has an anchor in the project's docs yet.
SPREAD_ANCHOR = "published IPPO/MAPPO after 20M env steps: about -22 to -30 (docs/benchmarks.md)"

TASKS: dict[str, Task] = {
    "simple_spread_v3": Task(mpe("simple_spread_v3"), {"N": 3, "max_cycles": 25}, 500_000, anchor=SPREAD_ANCHOR),
    "simple_spread_v3_n10": Task(mpe("simple_spread_v3"), {"N": 10, "max_cycles": 25}, 500_000, suite=False),
    # Box actions in [0, 1] (mpe2's continuous_actions): the look at continuous actions on a short-episode task.
    "simple_spread_v3_box": Task(mpe("simple_spread_v3"), {"N": 3, "max_cycles": 25, "continuous_actions": True},
                                 500_000, suite=False),
    "simple_speaker_listener_v4_box": Task(mpe("simple_speaker_listener_v4"),
                                           {"max_cycles": 25, "continuous_actions": True}, 500_000, suite=False),
    "simple_speaker_listener_v4": Task(mpe("simple_speaker_listener_v4"), {"max_cycles": 25}, 500_000),
    "simple_adversary_v3": Task(mpe("simple_adversary_v3"), {"N": 2, "max_cycles": 25}, 500_000, cross_play=True),
    "multiwalker_v9": Task(lambda **kw: sisl_env("multiwalker_v9")(**kw), {"max_cycles": 500}, 1_000_000,
                           smoke_env_kwargs={"max_cycles": 25}),
    "pursuit": Task(lambda **kw: sisl_env("pursuit_v4", "pursuit_v5")(**kw), {"max_cycles": 500}, 500_000,
                    smoke_env_kwargs={"max_cycles": 25}),
    "pistonball_v6": Task(make_pistonball, {"n_pistons": 4, "continuous": False, "max_cycles": 125}, 50_000, n_envs=4,
                          policy="CnnPolicy", smoke_env_kwargs={"max_cycles": 25}, skrl=False),
    "pistonball_v6_box": Task(make_pistonball, {"n_pistons": 4, "continuous": True, "max_cycles": 125}, 50_000,
                              n_envs=4, policy="CnnPolicy", smoke_env_kwargs={"max_cycles": 25}, skrl=False,
                              suite=False),
}
if importlib.util.find_spec("pettingzoo.sisl.waterworld_v4") is not None:  # PettingZoo < 1.27
    TASKS["waterworld_v4"] = Task(lambda **kw: sisl_env("waterworld_v4")(**kw), {"max_cycles": 500}, 1_000_000,
                                  smoke_env_kwargs={"max_cycles": 25})


def scored_agents(task_name: str, agents: list[str]) -> list[str]:
    """Whose returns are summed into a task's score: the good agents on simple_adversary, every agent elsewhere."""
    if TASKS[task_name].cross_play:
        return [agent for agent in agents if not cross_play.is_adversary(agent)]
    return agents


class EpisodeClock(BaseParallelWrapper):
    """Records each finished episode of one env copy as ``common.EpisodeRecorder`` does: env steps so far, seconds
    since ``start()``, team return and each agent's return. For learners that take a plain env (skrl)."""

    def __init__(self, env: ParallelEnv) -> None:
        super().__init__(env)
        self.episodes: list[dict[str, float]] = []
        self.env_steps = 0
        self.start_time = time.perf_counter()
        self._returns: dict[str, float] = {}

    def start(self) -> None:
        self.start_time = time.perf_counter()

    def reset(self, seed: int | None = None, options: dict | None = None) -> Any:
        self._returns = dict.fromkeys(self.env.possible_agents, 0.0)
        return self.env.reset(seed=seed, options=options)

    def step(self, actions: dict) -> Any:
        observations, rewards, terminations, truncations, infos = self.env.step(actions)
        self.env_steps += 1
        for agent, reward in rewards.items():
            self._returns[agent] += float(reward)
        if all(terminations[agent] or truncations[agent] for agent in terminations):
            record = {"env_steps": float(self.env_steps), "seconds": time.perf_counter() - self.start_time,
                      "team_return": sum(self._returns.values())}
            record.update({f"return/{agent}": value for agent, value in self._returns.items()})
            self.episodes.append(record)
            self._returns = dict.fromkeys(self._returns, 0.0)
        return observations, rewards, terminations, truncations, infos


@dataclass
class Learner:
    """One algorithm ready to train: ``learn(env_steps)``, its recorded episodes, and an actor for evaluation."""

    learn: Callable[[int], Any]
    episodes: Callable[[], list[dict[str, float]]]
    act: Callable[[str, Any], Any]  # (agent, raw observation) -> deterministic action
    model: Any = None  # IPPO or PPO, for saving and evaluate_model
    stacked: bool = False  # the peer: one network for all agents, padded observations


def build(algo: str, task_name: str, seed: int, smoke: bool) -> Learner:
    """A fresh learner of ``algo`` on ``task_name`` (2 copies with ``smoke``); building it is not timed, ``learn`` is."""
    task = TASKS[task_name]
    kwargs = task.kwargs(smoke)
    n_envs = 2 if smoke else task.n_envs
    probe = task.make_env(**kwargs)
    agents = list(probe.possible_agents)
    if algo in IPPO_ALGOS:
        env = make_vec_env(task.make_env, n_envs=n_envs, seed=seed, env_kwargs=kwargs)
        model = IPPO(task.policy, env, seed=seed, device="cpu", **learning.IPPO_VARIANTS[algo])
        recorder = common.EpisodeRecorder(agents, peer=False)
        return Learner(lambda steps: model.learn(steps, callback=recorder), lambda: recorder.episodes,
                       lambda agent, obs: model.predict({agent: obs}, deterministic=True)[0][agent], model)
    if algo == "mappo":
        if task.policy != "MlpPolicy":
            raise ValueError(f"MAPPO is not run on {task_name}: its critic input is built from vector observations")
        env = make_vec_env(task.make_env, n_envs=n_envs, seed=seed, env_kwargs=kwargs, critic_input="state")
        mappo = MAPPO(task.policy, env, critic_input="state", seed=seed, device="cpu")
        recorder = common.EpisodeRecorder(agents, peer=False)
        return Learner(lambda steps: mappo.learn(steps, callback=recorder), lambda: recorder.episodes,
                       lambda agent, obs: mappo.predict({agent: obs}, deterministic=True)[0][agent], mappo)
    if algo.startswith("peer"):
        vec_env = common.peer_vec_env(task.make_env(**kwargs), n_envs, seed)
        settings = SMOKE_PEER if smoke else PEER_SETTINGS[algo]
        peer = common.make_peer(vec_env, seed, policy=task.policy, **settings)
        shape = vec_env.observation_space.shape  # padded, before SB3 transposes images to channel-first
        assert shape is not None
        recorder = common.EpisodeRecorder(agents, peer=True)

        action_spaces = {agent: probe.action_space(agent) for agent in agents}

        def act_peer(agent: str, obs: np.ndarray) -> Any:
            # SuperSuit's pad_observations_v0: zeros appended up to the largest observation; pad_action_space_v0's
            # mapping back of a padded action to the agent's own space (a Discrete action past the agent's n is 0).
            padded = np.pad(obs, [(0, total - size) for total, size in zip(shape, obs.shape, strict=True)])
            action = peer.predict(padded, deterministic=True)[0]
            return homogenize_ops.dehomogenize_actions(action_spaces[agent], action)

        return Learner(lambda steps: peer.learn(steps * len(agents), callback=recorder), lambda: recorder.episodes,
                       act_peer, peer, stacked=True)
    if algo == "skrl":
        if not task.skrl:
            raise ValueError(f"skrl is not run on {task_name} (see the module docstring)")
        clock = EpisodeClock(task.make_env(**kwargs))
        rollouts = (SMOKE_PEER if smoke else PEER_SETTINGS["peer"])["n_steps"] * n_envs
        skrl = SkrlIPPO(clock, seed, rollouts=rollouts, n_epochs=SKRL_N_EPOCHS,
                        batch_size=SMOKE_PEER["batch_size"] if smoke else SKRL_BATCH_SIZE, learning_rate=3e-4)

        def learn_skrl(steps: int) -> None:
            clock.start()
            skrl.learn(steps)

        return Learner(learn_skrl, lambda: clock.episodes, lambda agent, obs: skrl.act(agent, obs, deterministic=True))
    if algo == "env":
        env = make_vec_env(task.make_env, n_envs=n_envs, seed=seed, env_kwargs=kwargs)
        return Learner(partial(step_randomly, env, seed), lambda: [], lambda agent, obs: None)
    raise ValueError(f"unknown algorithm {algo!r}: one of {ALGOS}")


def step_randomly(env: Any, seed: int, env_steps: int) -> None:
    """The ``env`` row's ``learn``: ``env_steps`` env steps of the copies with random actions, drawn before the clock
    starts (64 batches, cycled), so that the figure is the env layer's alone: what IPPO's ``learn`` would reach if
    acting and updating cost nothing."""
    n_batches = 64
    batches = {}
    for agent in env.possible_agents:
        space = env.action_spaces[agent]
        space.seed(seed)
        batches[agent] = np.stack([np.stack([space.sample() for _ in range(env.num_envs)]) for _ in range(n_batches)])
    env.reset()
    for step in range(-(-env_steps // env.num_envs)):
        env.step_agents({agent: actions[step % n_batches] for agent, actions in batches.items()})


def evaluate(learner: Learner, task_name: str, n_episodes: int, seed: int, smoke: bool) -> dict[str, float]:
    """Deterministic team and per-agent returns of a trained learner on one fresh copy."""
    env = TASKS[task_name].make_env(**TASKS[task_name].kwargs(smoke))

    def act(observations: dict[str, Any]) -> dict[str, Any]:
        return {agent: learner.act(agent, obs) for agent, obs in observations.items()}

    return common.evaluate_episodes(act, env, n_episodes, seed, stacked=False)


def run_path(args: argparse.Namespace, task_name: str, algo: str, seed: int) -> Path:
    """A run's files without their suffix: ``.csv`` (its training episodes) and ``.json`` (budget, time, evaluation)."""
    return args.out / "runs" / f"{task_name}_{algo}_seed{seed}"


def load_run(algo: str, task_name: str, seed: int, args: argparse.Namespace) -> dict[str, Any] | None:
    """A finished run's result read back from its files (``--reuse``; no learner), or None where they are missing."""
    path = run_path(args, task_name, algo, seed)
    if not (args.reuse and path.with_suffix(".csv").exists() and path.with_suffix(".json").exists()):
        return None
    with open(path.with_suffix(".csv")) as file:
        episodes = [{"env_steps": float(row["env_steps"]), "seconds": float(row["wall_seconds"]),
                     "team_return": float(row["episode_return"]),
                     **{key: float(value) for key, value in row.items() if key.startswith("return/")}}
                    for row in csv.DictReader(file)]
    recorded = json.loads(path.with_suffix(".json").read_text())
    print(f"reused {task_name} {algo} seed {seed}: {recorded['timesteps']:,} env steps, {len(episodes)} episodes",
          flush=True)
    return {"algo": algo, "task": task_name, "seed": seed, "episodes": episodes, "learner": None, **recorded}


def run_one(algo: str, task_name: str, seed: int, timesteps: int, args: argparse.Namespace) -> dict[str, Any]:
    """Train one learner, write its per-episode CSV, evaluate it; return its result (with the learner)."""
    reused = load_run(algo, task_name, seed, args)
    if reused is not None:
        return reused
    common.set_torch_threads(1)
    learner = build(algo, task_name, seed, args.smoke)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # IPPO's warning that a short smoke run made no update
        start = time.perf_counter()
        learner.learn(timesteps)
        train_seconds = time.perf_counter() - start
    episodes = learner.episodes()
    path = run_path(args, task_name, algo, seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    agent_keys = sorted({key for episode in episodes for key in episode if key.startswith("return/")})
    with open(path.with_suffix(".csv"), "w", newline="") as file:
        writer = csv.writer(file)
        writer.writerow(["algo", "task", "seed", "episode", "env_steps", "wall_seconds", "episode_return", *agent_keys])
        for index, episode in enumerate(episodes):
            writer.writerow([algo, task_name, seed, index, int(episode["env_steps"]), round(episode["seconds"], 4),
                             round(episode["team_return"], 4), *(round(episode.get(key, 0.0), 4) for key in agent_keys)])
    final = evaluate(learner, task_name, args.eval_episodes, 10_000 + seed, args.smoke)
    print(f"done {task_name} {algo} seed {seed}: {timesteps:,} env steps in {train_seconds:.1f} s, {len(episodes)} "
          f"episodes, eval (deterministic) team return {final['team_return']:.2f}", flush=True)
    recorded = {"timesteps": timesteps, "train_seconds": train_seconds, "final": final}
    path.with_suffix(".json").write_text(json.dumps(recorded, indent=1))
    return {"algo": algo, "task": task_name, "seed": seed, "timesteps": timesteps, "train_seconds": train_seconds,
            "episodes": episodes, "final": final, "learner": learner}


def window_mean(episodes: list[dict[str, float]], members: list[str], key: str, low: float, high: float) -> float:
    values = [sum(e[f"return/{a}"] for a in members) for e in episodes if low < e[key] <= high]
    return float(np.mean(values)) if values else float("nan")


def at_equal_time(result: dict[str, Any], members: list[str], seconds: float) -> tuple[float, int, bool]:
    """(return at T, env steps reached at T, finished its budget before T) for one run.

    The return at T is read as the equal-steps figure is, over the last 10% of the env steps reached at T: the
    episodes that ended in (0.9 S_T, S_T], S_T being the env steps of the last episode that ended by T.
    """
    reached = max((int(e["env_steps"]) for e in result["episodes"] if e["seconds"] <= seconds), default=0)
    value = window_mean(result["episodes"], members, "env_steps", 0.9 * reached, reached) if reached else float("nan")
    return value, reached, result["train_seconds"] < seconds


def at_env_steps(result: dict[str, Any], members: list[str], env_steps: int) -> tuple[float, bool]:
    """(return over (0.9 S, S], the run stopped short of S): S capped at the run's budget."""
    reached = min(env_steps, result["timesteps"])
    return window_mean(result["episodes"], members, "env_steps", 0.9 * reached, reached), reached < env_steps


def read_rates(path: Path | None) -> dict[tuple[str, str], float]:
    """(task, algo) -> env steps/s, from a ``throughput.csv`` of ``--throughput``."""
    if path is None:
        return {}
    with open(path) as file:
        return {(row["task"], row["algo"]): float(row["env_steps_per_s"]) for row in csv.DictReader(file)}


def summarize(results: list[dict[str, Any]], args: argparse.Namespace) -> list[dict[str, Any]]:
    """One row per task and algorithm (mean over seeds), plus each task's random-policy row."""
    rows: list[dict[str, Any]] = []
    rates = read_rates(args.rates)
    for task_name in dict.fromkeys(r["task"] for r in results):
        task_results = [r for r in results if r["task"] == task_name]
        agents = list(TASKS[task_name].make_env(**TASKS[task_name].kwargs(args.smoke)).possible_agents)
        members = scored_agents(task_name, agents)
        budget = min(r["timesteps"] for r in task_results)
        reference = {r["seed"]: r["train_seconds"] for r in task_results if r["algo"] == "peer"}
        # Cross-play needs the trained learners: runs read back with --reuse have none.
        opponents = {r["seed"]: r["learner"] for r in task_results if r["algo"] == "peer" and r["learner"] is not None}
        for algo in dict.fromkeys(r["algo"] for r in task_results):
            runs = [r for r in task_results if r["algo"] == algo]
            steps = [window_mean(r["episodes"], members, "env_steps", 0.9 * budget, budget) for r in runs]
            timed = [at_equal_time(r, members, reference[r["seed"]]) for r in runs if r["seed"] in reference]
            # From the rates of --throughput (alternating rounds, idle machine): the env steps S this algorithm makes
            # in the time the peer takes for the budget, read on its env-step curve. Immune to a shared machine.
            ratio = rates.get((task_name, algo), float("nan")) / rates.get((task_name, "peer"), float("nan"))
            rated_steps = int(budget * ratio) if np.isfinite(ratio) else 0
            rated = [at_env_steps(r, members, rated_steps) for r in runs] if rated_steps else []
            rated_values = [value for value, _ in rated]
            # (A run recorded by hand may give only the team return: its side's score is then unknown, nan.)
            evals = [r["final"]["team_return"] if members == agents
                     else sum(r["final"].get(f"return/{a}", float("nan")) for a in members) for r in runs]
            row = {
                "task": task_name, "algo": algo, "seeds": len(runs), "budget_env_steps": budget,
                "equal_env_steps": float(np.mean(steps)),
                "equal_env_steps_min": float(np.min(steps)), "equal_env_steps_max": float(np.max(steps)),
                "equal_time_seconds": float(np.mean(list(reference.values()))) if reference else float("nan"),
                "equal_time": float(np.mean([t[0] for t in timed])) if timed else float("nan"),
                "env_steps_at_equal_time": int(np.mean([t[1] for t in timed])) if timed else 0,
                "finished_early": any(t[2] for t in timed),
                "rate_ratio": ratio,
                "equal_time_rates": float(np.mean(rated_values)) if rated else float("nan"),
                "equal_time_rates_min": float(np.min(rated_values)) if rated else float("nan"),
                "equal_time_rates_max": float(np.max(rated_values)) if rated else float("nan"),
                "env_steps_at_equal_time_rates": rated_steps,
                "short_of_rates": any(short for _, short in rated),
                "eval_deterministic": float(np.mean(evals)),
                "train_seconds": float(np.mean([r["train_seconds"] for r in runs])),
                "peer_configuration": label(algo, args.smoke),
            }
            played = [cross_play_scores(r["learner"], opponents[r["seed"]], args) for r in runs
                      if TASKS[task_name].cross_play and r["seed"] in opponents and r["learner"] is not None]
            if played:
                good, adversary = zip(*played, strict=True)
                row["eval_deterministic"], row["eval_adversary"] = float(np.mean(good)), float(np.mean(adversary))
            rows.append(row)
        random_env = TASKS[task_name].make_env(**TASKS[task_name].kwargs(args.smoke))
        random = common.evaluate_random_env(random_env, 2 * args.eval_episodes, seed=0)
        random_score = sum(random[f"return/{a}"] for a in members)
        rows.append({"task": task_name, "algo": "random", "seeds": 0, "budget_env_steps": 0, "equal_env_steps": random_score,
                     "equal_time_seconds": float("nan"), "equal_time": random_score, "env_steps_at_equal_time": 0,
                     "equal_env_steps_min": random_score, "equal_env_steps_max": random_score,
                     "equal_time_rates_min": random_score, "equal_time_rates_max": random_score,
                     "finished_early": False, "rate_ratio": float("nan"), "equal_time_rates": random_score,
                     "env_steps_at_equal_time_rates": 0, "short_of_rates": False, "eval_deterministic": random_score,
                     "train_seconds": 0.0, "peer_configuration": "random actions"})
    return rows


def cross_play_scores(learner: Learner, opponent: Learner, args: argparse.Namespace) -> tuple[float, float]:
    """(good side's return against the opponent's adversary, adversary's return against the opponent's good side)."""
    episodes, seed = args.eval_episodes, 20_000
    good, _ = cross_play.play(lambda agent, obs: learner.act(agent, obs), lambda agent, obs: opponent.act(agent, obs),
                              episodes, seed)
    _, adversary = cross_play.play(lambda agent, obs: opponent.act(agent, obs), lambda agent, obs: learner.act(agent, obs),
                                   episodes, seed)
    return good, adversary


def table(rows: list[dict[str, Any]]) -> str:
    """The printed table: which figure is which, then one line per task and algorithm."""
    lines = [
        common.machine_description(),
        "equal steps: mean training-episode return over the last 10% of the budget (env steps).",
        "equal time: the same, over the last 10% of the env steps reached at T (steps@T), T = the 'peer' row's wall-clock "
        "seconds for its full budget (same seed); '<': finished its budget before T (read at its end).",
        "eval: deterministic evaluation of the final model (simple_adversary: good agents against the peer's adversary; "
        "eval adv.: adversary against the peer's good agents). Scores: team return (simple_adversary: good agents).",
        "Wall-clock figures come from one run each on a shared machine: quote --throughput's alternating rounds for speed.",
        "equal time (rates): the same, at the env steps S this algorithm makes in the peer's time for the budget by the "
        "--rates file's steps/s (x peer: their ratio); '<': the run stopped short of S (read at its end).",
        "",
        f"{'task':<31}{'algorithm':<19}{'budget':>10}{'equal steps':>13}{'equal time':>12}{'T (s)':>8}{'steps@T':>10}"
        f"{'x peer':>8}{'eq. time (rates)':>18}{'S':>10}{'eval':>9}{'eval adv.':>10}{'train s':>9}  configuration",
    ]
    for row in rows:
        mark = "<" if row["finished_early"] else " "
        short = "<" if row["short_of_rates"] else " "
        lines.append(
            f"{row['task']:<31}{row['algo']:<19}{row['budget_env_steps']:>10,}{row['equal_env_steps']:>13.2f}"
            f"{row['equal_time']:>11.2f}{mark}{row['equal_time_seconds']:>7.1f}{row['env_steps_at_equal_time']:>10,}"
            f"{row['rate_ratio']:>8.2f}{row['equal_time_rates']:>17.2f}{short}{row['env_steps_at_equal_time_rates']:>10,}"
            f"{row['eval_deterministic']:>9.2f}{row.get('eval_adversary', float('nan')):>10.2f}{row['train_seconds']:>9.1f}"
            f"  {row['peer_configuration']}"
        )
    shown = {row["task"] for row in rows}
    anchors = [f"{name}: {task.anchor}" for name, task in TASKS.items() if task.anchor and name in shown]
    return "\n".join(lines + (["", "anchors (our convention):", *anchors] if anchors else []))


def binned(xs: np.ndarray, ys: np.ndarray, n_bins: int) -> tuple[np.ndarray, np.ndarray]:
    """Means of ``ys`` in ``n_bins`` equal bins of ``xs`` (bin ends), empty bins left out."""
    if len(xs) == 0:
        return xs, ys
    edges = np.linspace(0, xs.max(), n_bins + 1)
    index = np.clip(np.searchsorted(edges, xs, side="left") - 1, 0, n_bins - 1)
    keep = [b for b in range(n_bins) if (index == b).any()]
    return edges[1:][keep], np.array([ys[index == b].mean() for b in keep])


def plot_task(task_name: str, results: list[dict[str, Any]], rows: list[dict[str, Any]], path: Path, n_bins: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(13, 4.5))
    random_row = next(r for r in rows if r["task"] == task_name and r["algo"] == "random")
    for result in results:
        episodes = result["episodes"]
        agents = [key.split("/", 1)[1] for key in (episodes[0] if episodes else {}) if key.startswith("return/")]
        members = scored_agents(task_name, agents)
        ys = np.array([sum(e[f"return/{a}"] for a in members) for e in episodes])
        label = f"{LABELS[result['algo']]}, seed {result['seed']}"
        for ax, key in zip(axes, ("seconds", "env_steps"), strict=True):
            ax.plot(*binned(np.array([e[key] for e in episodes]), ys, n_bins), color=COLORS[result["algo"]], label=label)
    for ax, xlabel in zip(axes, ("wall-clock seconds since the start of learn", "env steps (joint steps of one copy)"),
                          strict=True):
        ax.axhline(random_row["eval_deterministic"], linestyle="--", linewidth=1, color="gray", label="random policy")
        ax.set_xlabel(xlabel)
        ax.set_ylabel("training episode return (mean per bin)")
        ax.grid(alpha=0.3)
    peer_seconds = [r["train_seconds"] for r in results if r["algo"] == "peer"]
    if peer_seconds:
        axes[0].axvline(float(np.mean(peer_seconds)), linestyle=":", color=COLORS["peer"], label="T: the peer's time")
    for row in rows:  # with --rates: where each algorithm is read at equal time, on its env-step curve
        if row["task"] == task_name and row["algo"] not in ("peer", "random") and row["env_steps_at_equal_time_rates"]:
            axes[1].axvline(row["env_steps_at_equal_time_rates"], linestyle=":", color=COLORS[row["algo"]],
                            label=f"S: {row['algo']}'s env steps in the peer's time (--rates)")
    axes[1].legend(fontsize=7, loc="lower right")
    axes[0].legend(fontsize=7, loc="lower right")
    scored = "good agents' return" if TASKS[task_name].cross_play else "team return"
    fig.suptitle(f"{task_name}: {scored} against wall-clock time and env steps", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write_summary(rows: list[dict[str, Any]], out: Path) -> None:
    fields = list(dict.fromkeys(key for row in rows for key in row))
    with open(out / "summary.csv", "w", newline="") as file:
        writer = csv.DictWriter(file, fieldnames=fields)
        writer.writeheader()
        writer.writerows({k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()} for row in rows)


def measure_throughput(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Env steps/s of each algorithm on each task: fresh learners, ``--rounds`` rounds in rotating order, medians."""
    rows = []
    for task_name in args.tasks:
        algos = [a for a in args.algos if a != "skrl" or TASKS[task_name].skrl]
        rates: dict[str, list[float]] = {algo: [] for algo in algos}
        for round_idx in range(args.rounds):
            order = algos[round_idx % len(algos):] + algos[: round_idx % len(algos)]
            for algo in order:
                learner = build(algo, task_name, args.seed_offset + round_idx, args.smoke)
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    start = time.perf_counter()
                    learner.learn(args.throughput_steps)
                rates[algo].append(args.throughput_steps / (time.perf_counter() - start))
        peer = statistics.median(rates["peer"]) if rates.get("peer") else float("nan")
        env_layer = statistics.median(rates["env"]) if rates.get("env") else float("nan")
        for algo, values in rates.items():
            median = statistics.median(values)
            rows.append({"task": task_name, "algo": algo, "env_steps_per_s": median, "min": min(values), "max": max(values),
                         "ratio_to_peer": median / peer, "ratio_to_env": median / env_layer, "rounds": len(values),
                         "env_steps_per_round": args.throughput_steps, "configuration": label(algo, args.smoke)})
    lines = [common.machine_description(),
             f"env steps/s, median over {args.rounds} rounds of {args.throughput_steps:,} env steps (fresh learners, order "
             "rotated every round); ratios: to the 'peer' row (its configuration beside it), and to the 'env' row (the "
             "env layer alone with random actions: the physical limit of learning on those copies).",
             f"{'task':<31}{'algorithm':<19}{'env steps/s':>12}{'min':>9}{'max':>9}{'x peer':>8}{'x env':>7}  configuration"]
    lines += [f"{r['task']:<31}{r['algo']:<19}{r['env_steps_per_s']:>12,.0f}{r['min']:>9,.0f}{r['max']:>9,.0f}"
              f"{r['ratio_to_peer']:>8.2f}{r['ratio_to_env']:>7.2f}  {r['configuration']}" for r in rows]
    text = "\n".join(lines)
    print(text)
    common.write_results(args.out, "throughput", text, rows)
    return rows


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", nargs="+", default=[name for name, task in TASKS.items() if task.suite],
                        choices=list(TASKS))
    parser.add_argument("--algos", nargs="+", default=list(DEFAULT_ALGOS), choices=ALGOS)
    parser.add_argument("--seeds", type=int, default=1, help="seeds 0..S-1")
    parser.add_argument("--timesteps", type=int, default=None, help="env steps per run (default: the task's budget)")
    parser.add_argument("--ippo-timesteps", type=int, default=None,
                        help="env steps per IPPO run (default: as --timesteps); more than the peer's budget lets the "
                             "equal-time figures read IPPO past it")
    parser.add_argument("--rates", type=Path, default=None,
                        help="a throughput.csv of --throughput (same tasks and algos): adds the equal-time figure "
                             "read at the env steps each algorithm makes in the peer's time by those rates")
    parser.add_argument("--reuse", action="store_true",
                        help="read back the runs already recorded in --out/runs (a .csv and a .json each) instead of "
                             "training them again: runs of one table can come from several processes")
    parser.add_argument("--eval-episodes", type=int, default=100, help="deterministic evaluation episodes")
    parser.add_argument("--bins", type=int, default=40, help="points per curve")
    parser.add_argument("--out", type=Path, default=Path("runs/time_to_quality"))
    parser.add_argument("--smoke", action="store_true",
                        help="a tiny run of everything: 2 copies, 25-step episodes, 8 episodes per copy, the peer updating "
                             f"every {SMOKE_PEER['n_steps']} steps per entry, 2 evaluation episodes")
    parser.add_argument("--throughput", action="store_true", help="measure env steps/s side by side instead")
    parser.add_argument("--rounds", type=int, default=3, help="--throughput: rounds per algorithm")
    parser.add_argument("--throughput-steps", type=int, default=30_000,
                        help="--throughput: env steps per round (from 20000, IPPO's \"auto\" starts a learner)")
    parser.add_argument("--seed-offset", type=int, default=0,
                        help="seeds start here (for one seed per process: --seeds 1 --seed-offset 2)")
    args = parser.parse_args(argv)
    if args.smoke:
        args.eval_episodes = min(args.eval_episodes, 2)
    return args


def main(argv: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """Run every (task, seed, algorithm), write the CSVs, PNGs and table; return the summary rows."""
    args = parse_args(argv)
    common.set_torch_threads(1)
    if args.throughput:
        return measure_throughput(args)
    results = []
    for task_name in args.tasks:
        task = TASKS[task_name]
        smoke_steps = 8 * task.kwargs(True).get("max_cycles", 25)  # 8 episodes in all (4 per copy): one IPPO update
        timesteps = args.timesteps or (smoke_steps if args.smoke else task.timesteps)
        algos = [algo for algo in args.algos if (algo != "skrl" or task.skrl) and algo != "env"]
        for seed in range(args.seed_offset, args.seed_offset + args.seeds):
            # The peer first: its time is the reference of the equal-time figure.
            for algo in sorted(algos, key=lambda a: a != "peer"):
                ours = algo in IPPO_ALGOS or algo == "mappo"
                budget = args.ippo_timesteps if ours and args.ippo_timesteps else timesteps
                results.append(run_one(algo, task_name, seed, budget, args))
    rows = summarize(results, args)
    args.out.mkdir(parents=True, exist_ok=True)
    write_summary(rows, args.out)
    for task_name in args.tasks:
        plot_task(task_name, [r for r in results if r["task"] == task_name], rows,
                  args.out / f"time_to_quality_{task_name}.png", args.bins)
    text = table(rows)
    print(text)
    (args.out / "time_to_quality.txt").write_text(text + "\n")
    return rows


if __name__ == "__main__":
    main()
