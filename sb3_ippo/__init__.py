"""Independent PPO (IPPO) for PettingZoo multi-agent environments, as a Stable-Baselines3 algorithm."""

from sb3_ippo.evaluation import MultiAgentEvalCallback, evaluate_policy
from sb3_ippo.ippo import IPPO
from sb3_ippo.vec_env import MultiAgentVecEnv, make_vec_env

__all__ = ["IPPO", "MultiAgentEvalCallback", "MultiAgentVecEnv", "evaluate_policy", "make_vec_env"]
__version__ = "0.1.0"
