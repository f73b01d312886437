"""The multi-agent vectorized env layer: ``n_envs`` copies of a PettingZoo env as per-agent arrays, one module per kind
of copy, as SB3's ``common.vec_env`` package is laid out.

- :mod:`~sb3_ippo.vec_env.base`: :class:`MultiAgentVecEnv`, the arrays and step result every kind shares;
- :mod:`~sb3_ippo.vec_env.copies`: one env copy (auto-reset, episode statistics, failures and rebuilds);
- :mod:`~sb3_ippo.vec_env.dummy`, :mod:`~sb3_ippo.vec_env.subproc`, :mod:`~sb3_ippo.vec_env.ray`: copies in this
  process, in worker processes, in Ray actors (Ray is imported only when asked for);
- :mod:`~sb3_ippo.vec_env.batched`: one env that steps every copy at once (natively batched; VMAS through
  :mod:`~sb3_ippo.vec_env.vmas`);
- :mod:`~sb3_ippo.games.turn_based`: copies of AEC games stepped turn by turn;
- :mod:`~sb3_ippo.vec_env.env_util`: ``make_vec_env``, which picks the kind.
"""

from sb3_ippo.vec_env.base import AgentID, MultiAgentStep, MultiAgentVecEnv, ObsArray
from sb3_ippo.vec_env.batched import BatchedMultiAgentVecEnv, BatchedParallelEnv
from sb3_ippo.vec_env.copies import to_parallel_env
from sb3_ippo.vec_env.dummy import DummyMultiAgentVecEnv
from sb3_ippo.vec_env.env_util import as_multiagent_vec_env, make_vec_env
from sb3_ippo.vec_env.subproc import SubprocMultiAgentVecEnv
from sb3_ippo.games.turn_based import TurnBasedMultiAgentVecEnv, is_turn_based_vec_env

__all__ = [
    "AgentID",
    "BatchedMultiAgentVecEnv",
    "BatchedParallelEnv",
    "DummyMultiAgentVecEnv",
    "MultiAgentStep",
    "MultiAgentVecEnv",
    "ObsArray",
    "SubprocMultiAgentVecEnv",
    "TurnBasedMultiAgentVecEnv",
    "as_multiagent_vec_env",
    "is_turn_based_vec_env",
    "make_vec_env",
    "to_parallel_env",
]
