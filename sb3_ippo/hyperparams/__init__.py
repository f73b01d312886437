"""Hyperparameters as data: rl-zoo style YAML files, a section per env id.

``ippo.yml`` beside this module holds IPPO's tuned settings for the tasks where they beat its defaults (today the
two-player board games). ``python -m sb3_ippo train`` applies them under a ``--hyperparams`` file and the command
line; Python code gets the same values without copying them::

    from pettingzoo.classic import tictactoe_v3
    from sb3_ippo import IPPO
    from sb3_ippo.hyperparams import tuned_hyperparameters

    env = tictactoe_v3.env()
    model = IPPO("MultiInputPolicy", env, **tuned_hyperparameters(env))

(:mod:`sb3_ippo.hyperparameters`, a different module, checks hyperparameter values.)
"""

from sb3_ippo.hyperparams.files import TUNED_FILE, read_hyperparams_file, tuned_hyperparameters

__all__ = ["TUNED_FILE", "read_hyperparams_file", "tuned_hyperparameters"]
