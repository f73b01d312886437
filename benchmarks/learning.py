"""Learning curves: team return against env steps, IPPO against SB3 PPO with SuperSuit parameter sharing.

Both algorithms train on 8 env copies for the same number of env steps (one joint step of one copy = 1), over
several seeds, and every finished training episode is recorded (its team return: the sum over agents; and each
agent's return). The curves are the mean of each seed's episodes in bins of env steps; the plot shows the mean
over seeds and the spread (min..max over seeds). After training, each model is evaluated on ``--eval-episodes``
episodes (deterministic and stochastic actions) and saved next to its cached run (``benchmarks/cross_play.py``
reads them).

- IPPO runs with its defaults (rollouts of 128 steps of every copy, ending early with the episodes where every copy's
  episodes end together: 125 on MPE; 10 shuffled passes over minibatches of 256, no KL stop, normalize_returns, 64x64
  networks, updates in the training process); ``ippo_before32`` with those
  before issue 32 (n_episodes 8, n_epochs 20, target_kl 0.02, batch_size None, ``async_training="auto"``).
- ``ippo_shared`` (only with ``--algos``): IPPO's defaults with ``share_parameters={"agent": True}``: the good
  agents of simple_adversary (all agents of simple_spread) share one network, the adversary keeps its own.
- ``ippo_shared_ppo`` (only with ``--algos``): ``ippo_shared`` whose shared group trains with SB3 PPO's passes
  and a small entropy bonus (``group_kwargs={"agent": dict(n_epochs=10, batch_size=128, target_kl=None,
  ent_coef=0.01)}``); the adversary keeps the defaults.
- ``ippo_shared_ppo128`` (only with ``--algos``): ``ippo_shared_ppo`` whose shared network has hidden layers of 128
  units (``policy_kwargs={"net_arch": [128, 128]}`` in the group's settings; every other network: 64x64).
- ``ippo_shared_ppo_episodic`` (only with ``--algos``): ``ippo_shared_ppo`` with ``time_limit_bootstrap=False`` for
  every agent: MPE's time limit (``max_cycles``) ends an episode as a termination, bootstrapping 0, as the peer's
  SB3 + SuperSuit does (SuperSuit's SB3 wrapper does not mark truncations).
- ``ippo_episodic`` (only with ``--algos``): IPPO's defaults with ``time_limit_bootstrap=False``.
- ``ippo_async`` (only with ``--algos``): IPPO's defaults with ``async_training=True`` (each update in a learner
  process while collection goes on with the previous version, whatever the budget). A run then uses two processes.
- ``ippo_async_e40``, ``ippo_async_e20`` (only with ``--algos``): ``ippo_async`` with n_epochs 40 or 20 (since
  issue 22, 20 is the default: ``ippo_async_e20`` trains as ``ippo_async`` does).
- ``ippo_shared_sb3`` (only with ``--algos``): every group shares one network (``share_parameters=True``), updated
  as SB3's PPO updates the peer: ``n_epochs=10``, ``batch_size=256``, ``target_kl=None``, ``shuffle_minibatches=True``.
- ``ippo_as_peer`` (only with ``--algos``): ``ippo_shared_sb3`` with the peer's batch rule and targets as well:
  ``rollout_len=256`` (SB3's rollout cadence: an update every 256 steps of each copy, ``n_steps`` left None: 256 x
  the copies), ``normalize_returns=False``, ``time_limit_bootstrap=False``.
- ``ippo_rollout128`` (only with ``--algos``): IPPO's independent networks with the batch rule independent of
  episode length and SB3's PPO update: ``rollout_len=128`` (an update every 128 steps of each copy: 1,024
  transitions per agent with 8 copies), ``batch_size=256``, ``n_epochs=10``, ``target_kl=None`` and
  ``shuffle_minibatches=True`` (SB3's PPO: 10 shuffled passes, no KL stop); IPPO's value targets otherwise.
- ``ippo_rollout128_sync`` (only with ``--algos``): ``ippo_rollout128`` with ``async_training=False``: every batch
  trained by the policy that collected it.
- ``ippo_rollout25`` (only with ``--algos``): IPPO's defaults with ``rollout_len=25``: on MPE's 25-step episodes
  and 8 copies the same batches as the defaults (200 transitions per agent), on longer episodes as many gradient
  steps per sample as there.
- ``ippo_share`` (only with ``--algos``): IPPO's defaults with ``share_parameters=True``: each group (sisl's
  walkers or pursuers, all of simple_spread's agents) trains one shared network, the one-line setting for many
  identical agents.
- ``ippo_mb64`` (only with ``--algos``): IPPO's defaults with ``batch_size=64``, SB3 PPO's own default: 4x the
  gradient steps per sample of the defaults' minibatches of 256.
- ``ippo_r32`` (only with ``--algos``): IPPO's defaults with ``rollout_len=32``: an update every 32 steps of each
  copy, 4x the updates of the defaults with the same gradient steps per sample.
- ``ippo_r32_e20_kl`` (only with ``--algos``): ``ippo_r32`` with ``n_epochs=20, target_kl=0.02``, the passes and KL
  stop of the rule before issue 32 on SB3's cadence.
- ``ippo_e20_kl`` (only with ``--algos``): IPPO's defaults with ``n_epochs=20, target_kl=0.02``: up to 2x the
  gradient steps per sample, each update stopped once its KL passes 0.03.
- ``ippo_before32_sync`` (only with ``--algos``): ``ippo_before32`` with ``async_training=False``.
- ``ippo_r25_e20_kl`` (only with ``--algos``): ``ippo_r32_e20_kl`` with ``rollout_len=25``: on MPE's 25-step
  episodes and 8 copies, the old rule's batches (8 whole episodes) on SB3's cadence.
- ``ippo_r125`` (only with ``--algos``): IPPO's defaults with ``rollout_len=125``: on MPE no episode cut.
- ``ippo_r50_e20_kl`` (only with ``--algos``): ``ippo_r25_e20_kl`` with ``rollout_len=50`` (whole episodes on MPE).
- ``ippo_cut`` (only with ``--algos``): IPPO's defaults with ``align_rollouts=False``: SB3's cadence to the step, every
  rollout 128 steps long, cutting the episode in progress (the defaults of issue 32 before rollouts ended with the
  episodes). The rows measured on those defaults (``ippo_rollout128_sync``, ``ippo_r32``, ``ippo_mb64``, ...) set it
  too, so that they train as they did when measured; ``ippo_share`` follows the defaults.
- ``ippo_lin`` (only with ``--algos``): IPPO's defaults with SB3's ``LinearSchedule(3e-4, 0.0, 1.0)``: the learning
  rate decays from 3e-4 to 0 over the run (``--learning-rate lin_3e-4`` on the command line).
- ``ippo_norm_obs`` (only with ``--algos``): IPPO's defaults with ``normalize_obs=True``.
- ``ippo_e20_kl_lin`` (only with ``--algos``): ``rollout_len=32, n_epochs=20, target_kl=0.02`` (rollouts ending with the
  episodes: on MPE the old rule's batches of 8 whole episodes) with ``ippo_lin``'s decaying learning rate.
- ``ippo_std`` (only with ``--algos``): IPPO's defaults with ``policy_kwargs=dict(log_std_init=-1.0)``: on Box actions an
  initial std of 0.37 instead of SB3's 1. ``ippo_std05`` and ``ippo_std2``: the same with -0.5 (0.61) and -2 (0.14).
  ``ippo_std0``: SB3's 0, a std of 1. Stop 43's defaults started every Box at -0.5 (``ippo_std05``); since stop 44
  each dimension starts at SB3's std, never wider than half its range (on [-1, 1]: ``ippo_std0`` bit for bit; on
  mpe2's [0, 1]: 0.5). The rows measured before stop 43 keep SB3's std (``STD1``): on Box tasks they train as they
  did then; ``ippo_share`` and the rows written since follow the defaults.
- ``ippo_ent01`` (only with ``--algos``): IPPO's defaults with ``ent_coef=0.01``, an entropy bonus (MAPPO's MPE
  setting; SB3's PPO and IPPO's defaults: 0).
- ``ippo_share_std0`` (only with ``--algos``): ``ippo_share`` with ``policy_kwargs=dict(log_std_init=0.0)``: on Box
  actions the one-line setting as measured before stop 43 (on [-1, 1]: ``ippo_share`` since stop 44).
- ``ippo_e80_sync`` (only with ``--algos``): the defaults before issue 22, n_epochs 80 and ``async_training=False``.
- The peer is SB3 ``PPO`` with SB3's defaults except ``n_steps=256`` per ``VecEnv`` entry (8 copies x 256 =
  2,048 env steps per update, the scale MAPPO's MPE runs use; SB3's 2,048 would make one update every 16,384
  env steps) and ``batch_size=256`` (PettingZoo's SB3 tutorials); ``--peer-n-steps``/``--peer-batch-size``
  change them.

``simple_spread_v3`` (N=3, 25 cycles) is drawn beside reference scores on the same team-sum scale: random about
-80, a scripted optimal-assignment policy about -23, published IPPO/MAPPO after 20M steps about -22 to -30.
``simple_adversary_v3`` (N=2) is drawn per side: the adversary's return and the good agents' (summed).

The script's defaults are the issue's full size (3 seeds x 500k env steps per env and algorithm); each run is cached
in ``--cache`` as JSON, so an interrupted benchmark resumes and ``--plot-only`` redraws (a cached run is named by
env, row, seed and budget, not by settings: runs cached before IPPO's defaults changed, as in issue 22, are loaded
as they were; give a fresh ``--cache`` to rerun them); every ``--save-every`` env steps each run also writes its
episodes so far, which ``--plot-only --partial`` draws (the comparison is then cut at the env steps every run
reached). Runs execute in ``--jobs`` worker processes (one torch thread each).

    python benchmarks/learning.py [--envs simple_spread_v3 simple_adversary_v3] [--timesteps 500000]
        [--seeds 3] [--adversary-timesteps T] [--adversary-seeds S] [--jobs 1] [--out docs/benchmarks]
"""

from __future__ import annotations

import argparse
import csv
import json
import multiprocessing
import statistics
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common
from stable_baselines3.common.callbacks import BaseCallback, CallbackList
from stable_baselines3.common.utils import LinearSchedule

ALGOS = (
    "ippo",
    "peer",
    "ippo_shared",
    "ippo_async",
    "ippo_shared_ppo",
    "ippo_shared_ppo128",
    "ippo_shared_ppo_episodic",
    "ippo_episodic",
    "ippo_async_e40",
    "ippo_async_e20",
    "ippo_e80_sync",
    "ippo_mb256",
    "ippo_shared_sb3",
    "ippo_as_peer",
    "ippo_rollout128",
    "ippo_rollout128_sync",
    "ippo_rollout25",
    "ippo_as_peer_sync",
    "ippo_before32",
    "ippo_share",
    "ippo_mb64",
    "ippo_r32",
    "ippo_r32_e20_kl",
    "ippo_e20_kl",
    "ippo_before32_sync",
    "ippo_r25_e20_kl",
    "ippo_r125",
    "ippo_r50_e20_kl",
    "ippo_cut",
    "ippo_lin",
    "ippo_norm_obs",
    "ippo_e20_kl_lin",
    "ippo_std",
    "ippo_std05",
    "ippo_std2",
    "ippo_std0",
    "ippo_ent01",
    "ippo_share_std0",
)
LABELS = {
    "ippo": "IPPO (sb3_ippo, defaults)",
    "peer": "SB3 PPO + SuperSuit sharing",
    "ippo_shared": "IPPO, group 'agent' shares one network",
    "ippo_async": "IPPO, async_training (learner process)",
    "ippo_shared_ppo": "IPPO, group 'agent' shares one network, SB3-style passes",
    "ippo_shared_ppo128": "IPPO, group 'agent' shares one 128x128 network, SB3-style passes",
    "ippo_shared_ppo_episodic": "IPPO, group 'agent' shares one network, SB3-style passes, time limit as termination",
    "ippo_episodic": "IPPO (defaults), time limit as termination",
    "ippo_async_e40": "IPPO, async_training, n_epochs 40",
    "ippo_async_e20": "IPPO, async_training, n_epochs 20",
    "ippo_e80_sync": "IPPO, the defaults before issue 22 (n_epochs 80, synchronous)",
    "ippo_mb256": "IPPO (defaults), minibatches of 256 transitions",
    "ippo_shared_sb3": "IPPO, each group shares one network, updated as SB3's PPO",
    "ippo_as_peer": "IPPO configured as the peer (shared networks, SB3's update, rollouts of 256 steps)",
    "ippo_rollout128": "IPPO, rollouts of 128 steps per copy, SB3's update (minibatches of 256, 10 passes)",
    "ippo_rollout128_sync": "ippo_rollout128, updates in the training process (no learner process)",
    "ippo_as_peer_sync": "ippo_as_peer, updates in the training process (sisl's tuned settings)",
    "ippo_before32": "IPPO's defaults before issue 32 (whole episodes, 20 full-batch passes, KL stop, learner process)",
    "ippo_rollout25": "IPPO's defaults on rollouts of 25 steps per copy (MPE's batches, whatever the episode length)",
    "ippo_share": "IPPO's defaults, each group sharing one network (share_parameters=True)",
    "ippo_mb64": "IPPO's defaults with minibatches of 64 (SB3 PPO's default; 4x the gradient steps per sample)",
    "ippo_r32": "IPPO's defaults with rollouts of 32 steps per copy (4x the updates, the same gradient steps per sample)",
    "ippo_r32_e20_kl": "ippo_r32 with 20 passes and the KL stop at 0.02 (the rule before issue 32 on SB3's cadence)",
    "ippo_e20_kl": "IPPO's defaults with 20 passes and the KL stop at 0.02 (up to 2x the gradient steps per sample)",
    "ippo_before32_sync": "IPPO's defaults before issue 32 with every update in the training process",
    "ippo_r25_e20_kl": "ippo_r32_e20_kl on rollouts of 25 steps per copy (on MPE: whole episodes, 200 transitions)",
    "ippo_r125": "IPPO's defaults on rollouts of 125 steps per copy (on MPE: 5 whole episodes, no cut)",
    "ippo_r50_e20_kl": "ippo_r32_e20_kl on rollouts of 50 steps per copy (on MPE: 2 whole episodes, 400 transitions)",
    "ippo_cut": "IPPO's defaults with align_rollouts=False (SB3's cadence to the step: rollouts of 128 cut episodes)",
    "ippo_lin": "IPPO's defaults with the learning rate decaying linearly from 3e-4 to 0 over the run",
    "ippo_norm_obs": "IPPO's defaults with normalize_obs=True (per-agent running observation statistics)",
    "ippo_e20_kl_lin": "rollouts of 32 steps per copy, 20 passes, KL stop at 0.02, the learning rate decaying to 0",
    "ippo_std": "IPPO's defaults with log_std_init=-1 (Box actions: an initial std of 0.37 instead of 1)",
    "ippo_std05": "IPPO's defaults with log_std_init=-0.5 (Box actions: an initial std of 0.61 instead of 1)",
    "ippo_std2": "IPPO's defaults with log_std_init=-2 (Box actions: an initial std of 0.14 instead of 1)",
    "ippo_std0": "IPPO's defaults with SB3's log_std_init=0 (Box actions: an initial std of 1 on every dimension)",
    "ippo_ent01": "IPPO's defaults with ent_coef=0.01 (an entropy bonus, MAPPO's MPE setting; SB3's PPO: 0)",
    "ippo_share_std0": "ippo_share with SB3's log_std_init=0 (Box actions: ippo_share as measured before stop 43)",
}
PALETTE = (
    "tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown", "tab:pink", "tab:olive", "tab:gray",
    "tab:cyan", "black", "gold", "navy", "teal", "maroon", "lime", "darkviolet", "olive", "salmon",
    "peru", "indigo", "crimson", "darkgreen", "slateblue", "chocolate", "darkcyan", "orchid", "steelblue", "sienna",
    "darkorange", "rosybrown", "darkkhaki", "mediumpurple", "darkslategray", "firebrick", "darkseagreen", "deeppink",
    "darkred",
)
COLORS = dict(zip(ALGOS, PALETTE, strict=True))
# ``ippo_shared``: the agents of the group "agent" (simple_spread: all; simple_adversary: the good agents) share one
# network, the other groups keep independent ones.
SHARED_GROUPS = {"agent": True}
# ``ippo_shared_ppo``: the shared group also trains as SB3's PPO does (10 passes over minibatches, no KL stop), on
# IPPO's batches (8 episodes of each member), with a small entropy bonus; the other groups keep IPPO's defaults.
SHARED_PPO_SETTINGS: dict[str, Any] = {"n_epochs": 10, "batch_size": 128, "target_kl": None, "ent_coef": 0.01}
# ``ippo_shared_ppo128``: the same, with hidden layers of 128 units for the shared network (the others: 64).
# Box actions' initial std before stop 43 (SB3's: 1), kept by the rows measured then (below).
STD1: dict[str, Any] = {"log_std_init": 0.0}
SHARED_PPO_128_SETTINGS: dict[str, Any] = {**SHARED_PPO_SETTINGS, "policy_kwargs": {"net_arch": [128, 128], **STD1}}
# IPPO's defaults before issue 32: the reference's whole-episode rule, 20 full-batch passes with the KL stop, and the
# learner process for budgets of 20,000 env steps or more. The rows measured then are written relative to them, so
# that they keep training as they did when their figures were taken.
BEFORE32: dict[str, Any] = {
    "n_episodes": 8, "rollout_len": None, "batch_size": None, "n_epochs": 20, "target_kl": 0.02,
    "shuffle_minibatches": False, "async_training": "auto",
}
# The defaults of issue 32 before rollouts ended with the episodes: SB3's cadence to the step, every rollout of
# rollout_len steps, cutting the episode in progress. The rows measured on those defaults are written relative to
# them (``**CUT``), so that they keep training as they did when their figures were taken.
CUT: dict[str, Any] = {"align_rollouts": False}
# SB3's linear schedule from 3e-4 to 0 over the run (``--learning-rate lin_3e-4``), for the rows that decay the rate.
LIN: dict[str, Any] = {"learning_rate": LinearSchedule(3e-4, 0.0, 1.0)}
# The keyword arguments of each IPPO row (time_to_quality.py takes them too).
IPPO_VARIANTS: dict[str, dict[str, Any]] = {
    "ippo": {},
    "ippo_shared": {**BEFORE32, "share_parameters": SHARED_GROUPS},
    "ippo_async": {**BEFORE32, "async_training": True},
    "ippo_shared_ppo": {**BEFORE32, "share_parameters": SHARED_GROUPS, "group_kwargs": {"agent": SHARED_PPO_SETTINGS}},
    "ippo_shared_ppo128": {**BEFORE32, "share_parameters": SHARED_GROUPS, "group_kwargs": {"agent": SHARED_PPO_128_SETTINGS}},
    "ippo_shared_ppo_episodic": {
        **BEFORE32, "share_parameters": SHARED_GROUPS,
        "group_kwargs": {"agent": SHARED_PPO_SETTINGS},
        "time_limit_bootstrap": False,
    },
    "ippo_episodic": {**BEFORE32, "time_limit_bootstrap": False},
    "ippo_async_e40": {**BEFORE32, "async_training": True, "n_epochs": 40},
    "ippo_async_e20": {**BEFORE32, "async_training": True, "n_epochs": 20},
    "ippo_e80_sync": {**BEFORE32, "async_training": False, "n_epochs": 80},
    # Minibatches of 256 transitions: the same as the defaults where an agent's batch is at most 256 (MPE's 8 episodes
    # of 25 steps), more gradient steps per sample on long episodes (multiwalker, pursuit).
    "ippo_mb256": {**BEFORE32, "batch_size": 256},
    # The peer's algorithm on IPPO's machinery: each group (pursuit's 8 pursuers, multiwalker's 3 walkers) shares one
    # network, updated as SB3's PPO updates the peer (10 shuffled passes over minibatches of 256, no KL stop); IPPO's
    # batch rule (an update after 8 finished episodes of each agent), value scaling and bootstrap otherwise. It tells
    # how much of a gap to the peer is sharing and update rule, and how much is the rest.
    "ippo_shared_sb3": {
        **BEFORE32,
        "share_parameters": True, "n_epochs": 10, "batch_size": 256, "target_kl": None, "shuffle_minibatches": True,
    },
    # ``ippo_shared_sb3`` with the peer's batch rule and targets too: an update every 256 steps of each env copy, as the
    # peer's 256 per VecEnv entry (every agent's trajectory in a copy cut each 256 of its steps there, counted across
    # episode ends, bootstrapping from V of the next observation; n_steps None: 256 x 8 copies = 2,048 transitions per
    # agent), raw returns for the value head, and a time limit as a termination (SuperSuit's SB3 wrapper does not mark
    # truncations). What is left of a gap is IPPO's machinery.
    "ippo_as_peer": {
        **BEFORE32, **CUT, "n_episodes": None,
        "share_parameters": True, "n_epochs": 10, "batch_size": 256, "target_kl": None, "shuffle_minibatches": True,
        "rollout_len": 256, "normalize_returns": False, "time_limit_bootstrap": False,
    },
    "ippo_before32": BEFORE32,
    # ``ippo_as_peer`` with every update in the training process: sisl's tuned settings as they run from issue 32 on.
    "ippo_as_peer_sync": {
        **CUT, "share_parameters": True, "n_epochs": 10, "batch_size": 256, "target_kl": None, "shuffle_minibatches": True,
        "rollout_len": 256, "normalize_returns": False, "time_limit_bootstrap": False, "async_training": False,
    },
    # The batch rule independent of episode length on IPPO's own networks (one per agent): SB3's rollout of 128 steps
    # per copy and SB3's PPO update (10 shuffled passes over minibatches of 256, no KL stop), IPPO's value targets.
    "ippo_rollout128": {
        **BEFORE32, **CUT, "n_episodes": None,
        "rollout_len": 128, "batch_size": 256, "n_epochs": 10, "target_kl": None, "shuffle_minibatches": True,
    },
    # ``ippo_rollout128`` with every update in the training process (``async_training=False``): each batch collected
    # by the policy it trains, no one-update lag of a learner process: the defaults since issue 32.
    "ippo_rollout128_sync": {
        **CUT, "rollout_len": 128, "batch_size": 256, "n_epochs": 10, "target_kl": None, "shuffle_minibatches": True,
        "async_training": False,
    },
    # IPPO's defaults with the batch rule independent of episode length, at the size the defaults' n_episodes=8 give
    # MPE's 25-step episodes on 8 copies (200 transitions per agent, an update every 25 steps of each copy): on MPE the
    # same batches as the defaults; on 500-step episodes (sisl) 20x more updates per sample than n_episodes=8 gives.
    "ippo_rollout25": {**BEFORE32, "n_episodes": None, "rollout_len": 25},
    # The one-line setting for many identical agents: the defaults with each group sharing one network.
    "ippo_share": {"share_parameters": True},
    # The defaults with SB3 PPO's own minibatch size: 4x the gradient steps per sample of independent networks.
    "ippo_mb64": {**CUT, "batch_size": 64},
    # The defaults with an update every 32 steps of each copy: 4x the updates (policy iterations) of rollouts of 128,
    # the same gradient steps per sample (8 copies: one minibatch of 256 per pass).
    "ippo_r32": {**CUT, "rollout_len": 32},
    # ``ippo_r32`` with the passes and KL stop of the rule before issue 32 (up to 20 passes, stop past 1.5 x 0.02): on
    # MPE's 25-step episodes about that rule's batches, on SB3's cadence whatever the episode length.
    "ippo_r32_e20_kl": {**CUT, "rollout_len": 32, "n_epochs": 20, "target_kl": 0.02},
    # The defaults with those passes and KL stop on rollouts of 128: up to 2x the gradient steps per sample.
    "ippo_e20_kl": {**CUT, "n_epochs": 20, "target_kl": 0.02},
    # The rule before issue 32 without its learner process: what the one-update lag changes.
    "ippo_before32_sync": {**BEFORE32, "async_training": False},
    # ``ippo_r32_e20_kl`` on rollouts of 25: on MPE's 25-step episodes and 8 copies the batches of the rule before
    # issue 32 (8 whole episodes, one minibatch of 200), on SB3's cadence; ``ippo_rollout25`` without its learner
    # process (one shuffled minibatch of 200 where that row keeps stored order: the same mean loss).
    "ippo_r25_e20_kl": {"rollout_len": 25, "n_epochs": 20, "target_kl": 0.02},
    # The defaults on rollouts of 125 steps per copy: on MPE's 25-step episodes no episode is cut (128 cuts one per
    # rollout), 1000 transitions per agent against 1024: what the cut costs at the defaults' size.
    "ippo_r125": {"rollout_len": 125},
    # ``ippo_r25_e20_kl`` on rollouts of 50: whole episodes again (on MPE) but a larger batch than ``ippo_r32_e20_kl``'s
    # cut one (400 transitions against 256): separates the cut from the batch size.
    "ippo_r50_e20_kl": {"rollout_len": 50, "n_epochs": 20, "target_kl": 0.02},
    # The defaults of issue 32 before rollouts ended with the episodes (the previous default, to compare against).
    "ippo_cut": CUT,
    # The defaults with the learning rate decaying to 0 over the run.
    "ippo_lin": LIN,
    # The defaults with running observation statistics per agent (rl-zoo's ``normalize: true`` of walker tasks).
    "ippo_norm_obs": {"normalize_obs": True},
    # ``ippo_r32_e20_kl`` with rollouts that end with the episodes (on MPE: ``ippo_r25_e20_kl``, the batches of the rule
    # before issue 32) and the learning rate of ``ippo_lin``.
    "ippo_e20_kl_lin": {"rollout_len": 32, "n_epochs": 20, "target_kl": 0.02, **LIN},
    # The defaults with a narrower initial Gaussian on Box actions (SB3's log_std_init=0 is a std of 1 on actions that
    # multiwalker clips to [-1, 1]); on Discrete actions the same as the defaults.
    "ippo_std": {"policy_kwargs": {"log_std_init": -1.0}},
    "ippo_std05": {"policy_kwargs": {"log_std_init": -0.5}},
    "ippo_std2": {"policy_kwargs": {"log_std_init": -2.0}},  # rl-zoo's choice for most PyBullet tasks
    # The defaults with SB3's initial std on Box actions: IPPO's default before stop 43, and since stop 44 on [-1, 1].
    "ippo_std0": {"policy_kwargs": STD1},
    # The defaults with an entropy bonus (MAPPO's MPE configuration uses 0.01): exploration kept up where the policies
    # settle early, as simple_spread's seeds that stay on the plateau near -47 do.
    "ippo_ent01": {"ent_coef": 0.01},
    # ``ippo_share`` with SB3's initial std on Box actions: the one-line setting as it was measured before stop 43.
    "ippo_share_std0": {"share_parameters": True, "policy_kwargs": STD1},
}
# Box actions started from SB3's std of 1 (``log_std_init=0``) before stop 43. The rows measured then keep it, as the
# rows of the cut defaults keep ``CUT``, so that their figures (multiwalker's) reproduce; on Discrete actions it
# changes nothing. The defaults, the one-line ``ippo_share`` and the rows written since follow IPPO's initial std;
# the ``ippo_std`` rows set their own.
FOLLOW_THE_INITIAL_STD = ("ippo", "ippo_share", "ippo_ent01")
IPPO_VARIANTS = {
    name: kwargs if name in FOLLOW_THE_INITIAL_STD or "policy_kwargs" in kwargs else {**kwargs, "policy_kwargs": STD1}
    for name, kwargs in IPPO_VARIANTS.items()
}
SPREAD_REFERENCES = (
    (-80.0, "random (about -80)"),
    (-23.0, "scripted optimal assignment (about -23)"),
    (-26.0, "published IPPO/MAPPO at 20M steps (-22 to -30)"),
)


def run_one(task: dict[str, Any]) -> dict[str, Any]:
    """Train one algorithm on one env with one seed; return its episodes and final evaluation."""
    common.set_torch_threads(1)
    env_name, algo, seed, timesteps = task["env"], task["algo"], task["seed"], task["timesteps"]
    kwargs = common.env_kwargs(env_name)
    agents = common.agent_ids(env_name, kwargs)
    recorder = common.EpisodeRecorder(agents, peer=algo == "peer")
    callback = CallbackList([recorder, PartialSaver(recorder, task)])
    start = time.perf_counter()
    if algo.startswith("ippo"):
        from sb3_ippo import IPPO

        env: Any = common.make_ippo_env(env_name, task["n_envs"], seed, kwargs)
        model: Any = IPPO("MlpPolicy", env, seed=seed, device="cpu", **IPPO_VARIANTS[algo])
        model.learn(total_timesteps=timesteps, callback=callback)
        evaluate = common.evaluate_ippo
    else:
        env = common.make_peer_env(env_name, task["n_envs"], seed, kwargs)
        model = common.make_peer(env, seed, n_steps=task["peer_n_steps"], batch_size=task["peer_batch_size"])
        model.learn(total_timesteps=timesteps * len(agents), callback=callback)
        evaluate = common.evaluate_peer
    train_seconds = time.perf_counter() - start
    env.close()
    model_path = cache_path(Path(task["cache"]), task).with_suffix(".zip")  # for benchmarks/cross_play.py
    model_path.parent.mkdir(parents=True, exist_ok=True)
    model.save(model_path)
    final = {
        mode: evaluate(model, env_name, kwargs, task["eval_episodes"], 10_000 + seed, deterministic=mode == "deterministic")
        for mode in ("deterministic", "stochastic")
    }
    return {**task, "agents": agents, "train_seconds": train_seconds, "episodes": recorder.episodes, "final": final}


class PartialSaver(BaseCallback):
    """Every ``task["save_every"]`` env steps, writes the episodes so far next to the run's cache file
    (``*.partial.json``), so that ``--plot-only --partial`` can draw a run that was stopped before its end."""

    def __init__(self, recorder: common.EpisodeRecorder, task: dict[str, Any]) -> None:
        super().__init__()
        self.recorder, self.task = recorder, task
        self.path = cache_path(Path(task["cache"]), task).with_suffix(".partial.json")
        self.next_save = task["save_every"]

    def _on_step(self) -> bool:
        env_steps = self.recorder.env_steps()
        if env_steps >= self.next_save:
            self.next_save += self.task["save_every"]
            partial = {**self.task, "timesteps": env_steps, "agents": self.recorder.agents, "partial": True,
                       "train_seconds": time.perf_counter() - self.recorder.start_time, "episodes": self.recorder.episodes}
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.path.write_text(json.dumps(partial))
        return True


def cache_path(cache: Path, task: dict[str, Any]) -> Path:
    peer = f"_n{task['peer_n_steps']}_b{task['peer_batch_size']}" if task["algo"] == "peer" else ""
    return cache / f"{task['env']}_{task['algo']}{peer}_seed{task['seed']}_{task['timesteps']}.json"


def run_cached(args: tuple[dict[str, Any], str]) -> dict[str, Any]:
    task, cache = args
    path = cache_path(Path(cache), task)
    if path.exists():
        return json.loads(path.read_text())
    result = run_one(task)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result))
    print(
        f"done {task['env']} {task['algo']} seed {task['seed']}: {task['timesteps']:,} env steps in "
        f"{result['train_seconds']:.0f} s, final team return {result['final']['deterministic']['team_return']:.1f}",
        flush=True,
    )
    return result


def sides(env_name: str, agents: list[str]) -> dict[str, list[str]]:
    """The curves drawn for an env: the team, and for simple_adversary each side."""
    curves = {"team": agents}
    if env_name == "simple_adversary_v3":
        curves["adversary"] = [agent for agent in agents if agent.startswith("adversary")]
        curves["good agents"] = [agent for agent in agents if not agent.startswith("adversary")]
    return curves


def binned_curve(result: dict[str, Any], members: list[str], bin_size: int, limit: int) -> tuple[np.ndarray, np.ndarray]:
    """Mean return of ``members`` (summed) over the episodes finished in each bin of env steps (bin ends), up to
    ``limit`` env steps."""
    episodes = [e for e in result["episodes"] if e["env_steps"] <= limit]
    n_bins = limit // bin_size
    steps = np.array([e["env_steps"] for e in episodes])
    values = np.array([sum(e[f"return/{agent}"] for agent in members) for e in episodes])
    ends, means = [], []
    for b in range(n_bins):
        in_bin = (steps > b * bin_size) & (steps <= (b + 1) * bin_size)
        if in_bin.any():
            ends.append((b + 1) * bin_size)
            means.append(values[in_bin].mean())
    return np.array(ends), np.array(means)


def final_training_return(result: dict[str, Any], members: list[str], limit: int) -> float:
    """Mean return of ``members`` over the training episodes of the last 10% of ``limit`` env steps."""
    tail = [e for e in result["episodes"] if 0.9 * limit < e["env_steps"] <= limit]
    return float(np.mean([sum(e[f"return/{agent}"] for agent in members) for e in tail]))


def write_outputs(
    results: list[dict[str, Any]], out: Path, bin_fraction: int, eval_episodes: int, earlier: Sequence[dict[str, str]] = ()
) -> list[dict[str, Any]]:
    """Write the CSVs and PNGs; return the summary rows (one per env, algorithm and side)."""
    out.mkdir(parents=True, exist_ok=True)
    envs = sorted({r["env"] for r in results}, key=list(common.ENV_MODULES).index)
    curve_rows: list[dict[str, Any]] = []
    summary: list[dict[str, Any]] = []
    for env_name in envs:
        env_results = [r for r in results if r["env"] == env_name]
        timesteps = min(r["timesteps"] for r in env_results)
        bin_size = max(timesteps // bin_fraction, 1)
        curves = sides(env_name, env_results[0]["agents"])
        random_scores = common.evaluate_random(env_name, common.env_kwargs(env_name), 2 * eval_episodes, seed=0)
        for side, members in curves.items():
            for algo in ALGOS:
                runs = [r for r in env_results if r["algo"] == algo]
                if not runs:
                    continue
                for r in runs:
                    for end, value in zip(*binned_curve(r, members, bin_size, timesteps), strict=True):
                        curve_rows.append(
                            {"env": env_name, "algo": algo, "seed": r["seed"], "side": side, "env_steps": int(end),
                             "mean_return": round(float(value), 3)}
                        )
                final_train = [final_training_return(r, members, timesteps) for r in runs]
                # A partial run (stopped before its end) has no final evaluation; nor does a run longer than the others.
                evaluated = [r for r in runs if "final" in r and r["timesteps"] == timesteps]
                final_det = [sum(r["final"]["deterministic"][f"return/{a}"] for a in members) for r in evaluated] or [np.nan]
                final_sto = [sum(r["final"]["stochastic"][f"return/{a}"] for a in members) for r in evaluated] or [np.nan]
                summary.append(
                    {
                        "env": env_name, "algo": algo, "side": side, "seeds": len(runs), "env_steps": timesteps,
                        "train_last10pct_mean": float(np.mean(final_train)),
                        "train_last10pct_min": float(np.min(final_train)),
                        "train_last10pct_max": float(np.max(final_train)),
                        "eval_deterministic_mean": float(np.mean(final_det)),
                        "eval_stochastic_mean": float(np.mean(final_sto)),
                        "random_policy": float(sum(random_scores[f"return/{a}"] for a in members)),
                        "train_minutes_median": statistics.median(r["train_seconds"] for r in runs) / 60,
                    }
                )
        plot_env(
            env_name, env_results, curves, bin_size, timesteps, out / f"learning_{env_name}.png", random_scores, earlier
        )

    with open(out / "learning_curves.csv", "w", newline="") as file:
        writer = csv.DictWriter(file, fieldnames=list(curve_rows[0]))
        writer.writeheader()
        writer.writerows(curve_rows)
    with open(out / "learning_summary.csv", "w", newline="") as file:
        writer = csv.DictWriter(file, fieldnames=list(summary[0]))
        writer.writeheader()
        writer.writerows({k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()} for row in summary)
    return summary


def plot_env(
    env_name: str,
    results: list[dict[str, Any]],
    curves: dict[str, list[str]],
    bin_size: int,
    limit: int,
    path: Path,
    random_scores: dict,
    earlier: Sequence[dict[str, str]] = (),
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(curves), figsize=(6.5 * len(curves), 4.5), squeeze=False)
    for ax, (side, members) in zip(axes[0], curves.items(), strict=True):
        for algo, color in COLORS.items():
            runs = [r for r in results if r["algo"] == algo]
            if not runs:
                continue
            per_seed = [dict(zip(*binned_curve(r, members, bin_size, limit), strict=True)) for r in runs]
            ends = sorted(set.intersection(*(set(curve) for curve in per_seed)))
            values = np.array([[curve[end] for end in ends] for curve in per_seed])
            ax.plot(ends, values.mean(axis=0), color=color, label=f"{LABELS[algo]} ({len(runs)} seeds)")
            ax.fill_between(ends, values.min(axis=0), values.max(axis=0), color=color, alpha=0.2)
        for algo, color in COLORS.items():
            rows = [r for r in earlier if r["env"] == env_name and r["side"] == side and r["algo"] == algo]
            if rows:
                by_end: dict[int, list[float]] = {}
                for row in rows:
                    by_end.setdefault(int(row["env_steps"]), []).append(float(row["mean_return"]))
                seeds = len({row["seed"] for row in rows})
                ends_earlier = sorted(by_end)
                ax.plot(ends_earlier, [float(np.mean(by_end[end])) for end in ends_earlier], color=color, linestyle=":",
                        label=f"{LABELS[algo]}, earlier run ({seeds} seeds)")
        if env_name == "simple_spread_v3" and side == "team":
            for value, label in SPREAD_REFERENCES:
                ax.axhline(value, linestyle="--", linewidth=1, color="gray")
                ax.annotate(label, (0, value), textcoords="offset points", xytext=(4, 3), fontsize=7, color="dimgray")
        else:
            random_value = sum(random_scores[f"return/{a}"] for a in members)
            ax.axhline(random_value, linestyle="--", linewidth=1, color="gray")
            ax.annotate(f"random ({random_value:.1f})", (0, random_value), textcoords="offset points", xytext=(4, 3),
                        fontsize=7, color="dimgray")
        ax.set_title(f"{env_name}: {side} return" + (f" ({', '.join(members)})" if side != "team" else " (sum over agents)"))
        ax.set_xlabel("env steps (joint steps of one copy)")
        ax.set_ylabel("training episode return (mean per bin)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="lower right")
    fig.suptitle(f"8 env copies; mean over seeds, shaded: min..max over seeds; bins of {bin_size:,} env steps", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--envs", nargs="+", default=list(common.ENV_MODULES), choices=list(common.ENV_MODULES))
    parser.add_argument("--algos", nargs="+", default=["ippo", "peer"], choices=ALGOS)
    parser.add_argument("--timesteps", type=int, default=500_000, help="env steps per run")
    parser.add_argument("--seeds", type=int, default=3, help="seeds 0..S-1")
    parser.add_argument("--only-seeds", type=int, nargs="+", default=None, help="run just these of the seeds")
    parser.add_argument("--adversary-timesteps", type=int, default=None, help="default: --timesteps")
    parser.add_argument("--adversary-seeds", type=int, default=None, help="default: --seeds")
    parser.add_argument("--n-envs", type=int, default=8, help="env copies")
    parser.add_argument("--peer-n-steps", type=int, default=256, help="the peer's n_steps per VecEnv entry")
    parser.add_argument("--peer-batch-size", type=int, default=256, help="the peer's minibatch size")
    parser.add_argument("--eval-episodes", type=int, default=100, help="evaluation episodes after training")
    parser.add_argument("--bins", type=int, default=40, help="points per curve")
    parser.add_argument("--jobs", type=int, default=1, help="worker processes (one torch thread each)")
    parser.add_argument("--out", type=Path, default=Path("docs/benchmarks"), help="where the PNGs and CSVs go")
    parser.add_argument("--cache", type=Path, default=Path("runs/learning_benchmark"), help="per-run JSON results")
    parser.add_argument("--plot-only", action="store_true", help="draw from the cached runs only")
    parser.add_argument("--partial", action="store_true", help="with --plot-only: use the partial results of unfinished runs")
    parser.add_argument("--save-every", type=int, default=5000, help="env steps between partial saves")
    parser.add_argument("--earlier", type=Path, default=None,
                        help="a learning_curves.csv of an earlier run, drawn dotted beside this run's curves")
    return parser.parse_args(argv)


def make_tasks(args: argparse.Namespace) -> list[dict[str, Any]]:
    tasks = []
    for env_name in args.envs:
        adversary = env_name == "simple_adversary_v3"
        timesteps = (args.adversary_timesteps if adversary else None) or args.timesteps
        seeds = (args.adversary_seeds if adversary else None) or args.seeds
        for seed in range(seeds):
            if args.only_seeds is not None and seed not in args.only_seeds:
                continue
            for algo in args.algos:
                tasks.append(
                    {"env": env_name, "algo": algo, "seed": seed, "timesteps": timesteps, "n_envs": args.n_envs,
                     "peer_n_steps": args.peer_n_steps, "peer_batch_size": args.peer_batch_size,
                     "eval_episodes": args.eval_episodes, "cache": str(args.cache), "save_every": args.save_every}
                )
    # One env at a time (all its runs, the slow IPPO ones first), so that a stopped benchmark leaves whole
    # comparisons behind rather than IPPO runs without their peers.
    return sorted(tasks, key=lambda t: (args.envs.index(t["env"]), t["algo"] == "peer"))


def main(argv: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """Run (or load) every run, write the CSVs and PNGs, print and return the summary."""
    args = parse_args(argv)
    common.set_torch_threads(1)
    tasks = make_tasks(args)
    if args.plot_only:
        results = []
        for task in tasks:
            path = cache_path(args.cache, task)
            partial = path.with_suffix(".partial.json")
            if path.exists():
                results.append(json.loads(path.read_text()))
            elif args.partial and partial.exists():
                results.append(json.loads(partial.read_text()))
    elif args.jobs > 1:
        # Not multiprocessing.Pool: its workers are daemons, which may not start a learner process (ippo_async's
        # would fail, and the defaults' async_training="auto" would update in the worker instead).
        context = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(args.jobs, mp_context=context, max_tasks_per_child=1) as pool:
            results = list(pool.map(run_cached, [(t, str(args.cache)) for t in tasks]))
    else:
        results = [run_cached((t, str(args.cache))) for t in tasks]
    earlier: list[dict[str, str]] = []
    if args.earlier is not None:
        with open(args.earlier, newline="") as file:
            earlier = list(csv.DictReader(file))
    summary = write_outputs(results, args.out, args.bins, args.eval_episodes, earlier)
    print(common.machine_description())
    header = ["env", "algo", "side", "seeds", "env steps", "train last 10%", "min", "max", "eval det.", "eval stoch.",
              "random", "train min"]
    print(f"{header[0]:>20}" + "".join(f"{h:>16}" for h in header[1:]))
    for row in summary:
        print(
            f"{row['env']:>20}{row['algo']:>16}{row['side'][:15]:>16}{row['seeds']:>16}{row['env_steps']:>16,}"
            + "".join(f"{row[key]:>16.1f}" for key in ("train_last10pct_mean", "train_last10pct_min", "train_last10pct_max",
                                                        "eval_deterministic_mean", "eval_stochastic_mean", "random_policy",
                                                        "train_minutes_median"))
        )
    return summary


if __name__ == "__main__":
    main()
