from sb3_ippo.ippo.ippo import IPPO
from sb3_ippo.ippo.policies import CnnPolicy, MlpPolicy, MultiInputPolicy

__all__ = ["IPPO", "CnnPolicy", "MlpPolicy", "MultiInputPolicy"]
