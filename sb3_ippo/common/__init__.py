"""The machinery every multi-agent algorithm of this package shares, as SB3's ``common`` package is PPO's. It imports
nothing of the algorithms (``ippo/``, ``mappo/``); import from the modules themselves (this package imports none of
them, so that each loads only what it needs: the learner process loads no env layer).

- :mod:`~sb3_ippo.common.base_class`: :class:`MultiAgentBaseAlgorithm`, the env and its agents, ``predict``, ``save``
  and ``load``;
- :mod:`~sb3_ippo.common.on_policy_algorithm`: :class:`MultiAgentOnPolicyAlgorithm`, the loop (``learn``,
  ``collect_rollouts``, applying an update) that an algorithm subclasses;
- :mod:`~sb3_ippo.common.buffer`: the per-agent episode buffer; :mod:`~sb3_ippo.common.groups`: agent groups;
  :mod:`~sb3_ippo.common.normalization`: observation and return normalization;
- :mod:`~sb3_ippo.common.acting`: acting outside ``learn`` as collection acts; :mod:`~sb3_ippo.common.evaluation`:
  ``evaluate_policy`` and ``MultiAgentEvalCallback``;
- :mod:`~sb3_ippo.common.logs`: the logger keys; :mod:`~sb3_ippo.common.plotting`: learning curves;
- :mod:`~sb3_ippo.common.export`: one agent as a plain SB3 ``PPO``;
- :mod:`~sb3_ippo.common.checks`: the checks of envs, spaces and policies; :mod:`~sb3_ippo.common.preprocessing`:
  images and discrete actions between env and policy; :mod:`~sb3_ippo.common.critic_input`: what a centralized
  critic sees; :mod:`~sb3_ippo.common.env_factory`: envs named by module; :mod:`~sb3_ippo.common.threads`: torch
  threads during ``learn``; :mod:`~sb3_ippo.common.type_aliases`: the shared type aliases.
"""
