"""The update of IPPO: from drained trajectories to new weights. It imports nothing of the env layer; import
from the modules themselves (this package imports none of them, so that each loads only what it needs).

- :mod:`~sb3_ippo.update.settings`: :class:`UpdateSettings`, every setting of one group's update, in one frozen object;
- :mod:`~sb3_ippo.update.batch`: a member's training batch, fresh-value GAE (``build_batch``, ``compute_gae``);
- :mod:`~sb3_ippo.update.ppo`: the PPO update of one policy (``ppo_update``, ``UpdateStats``);
- :mod:`~sb3_ippo.update.stacked`, :mod:`~sb3_ippo.update.stacked_update`: a group's independent networks evaluated
  and trained as one batch;
- :mod:`~sb3_ippo.update.runners`: one :class:`GroupRunner` per agent group, which acting and training both ask;
- :mod:`~sb3_ippo.update.trainer`: the update step over every group (``Trainer``, ``UpdateJob``, ``UpdateResult``);
- :mod:`~sb3_ippo.update.learner`: the learner process of ``async_training``.
"""
