"""Experiment tracking with Weights & Biases (``pip install 'sb3_ippo[wandb]'``).

wandb's own SB3 callback, ``wandb.integration.sb3.WandbCallback``, works with ``IPPO.learn`` as with SB3's ``PPO``:
with ``wandb.init(sync_tensorboard=True)`` and ``IPPO(..., tensorboard_log=...)`` every logger key reaches the run,
the per-agent ones (``rollout/<agent>/ep_rew_mean``, ``train/<agent>/...``) included, and ``model_save_path``
saves the model (one zip, every agent) into the run. Only its ``gradient_save_freq`` needs ``model.policy``, which
IPPO does not have (one policy per agent): :class:`WandbCallback` here is the same callback, which watches every
agent's networks instead.
"""

from __future__ import annotations

from typing import Any

try:
    import wandb
    from wandb.integration.sb3 import WandbCallback as _WandbCallback
except ImportError as error:  # pragma: no cover - depends on the install
    raise ImportError(
        "sb3_ippo.tracking needs wandb: pip install wandb (or pip install 'sb3_ippo[wandb]')"
    ) from error

__all__ = ["WandbCallback", "gradients_are_watchable"]


def gradients_are_watchable(model: Any) -> str | None:
    """None if the backward passes of ``model``'s updates run on its agents' own networks, in this process (where
    ``wandb.watch``'s hooks see them); else why not. With ``batched=True``, only the groups whose networks are
    stacked (several agents with their own weights) update through other tensors: a shared network, a group of one
    agent, recurrent and masked policies train on their own networks."""
    stacked = [name for name, runner in model._runners.items() if getattr(runner, "stacked", None) is not None]
    if stacked:
        # The update differentiates stacked copies of the members' parameters: no hook on a member's module fires.
        groups = ", ".join(f"{name!r} ({', '.join(map(str, model.groups[name]))})" for name in stacked)
        return (
            "batched=True updates through a path whose backward passes wandb.watch's hooks do not see: the stacked "
            f"networks of group {groups}"
        )
    if model.async_training is not False:
        return (
            f"async_training={model.async_training!r} may run the updates in a learner process, where this process's "
            "wandb.watch hooks do not see the gradients"
        )
    return None


class WandbCallback(_WandbCallback):
    """``wandb.integration.sb3.WandbCallback`` for IPPO: the same arguments and behaviour (hyperparameters into
    ``wandb.config``; with ``model_save_path``, the model saved to ``model_save_path/model.zip`` every
    ``model_save_freq`` calls and at the end, and uploaded with the run), and with ``gradient_save_freq > 0``
    ``wandb.watch`` on every agent's networks instead of SB3's single ``model.policy``: one watched model per
    policy (a shared policy once), logged as wandb names several models (``gradients/<parameter>`` for the first,
    ``gradients/graph_<i><parameter>`` for the others); ``wandb.config["watched_networks"]`` says which agents each
    one is. ``gradient_save_freq`` counts backward passes (minibatches), as in wandb.

    :raises ValueError: at the start of ``learn``, with ``gradient_save_freq > 0`` where the update does not run
        on the agents' own networks in this process (``batched=True`` with a group of several agents with their own
        weights, whose networks it stacks; or ``async_training`` not False): pass ``batched=False,
        async_training=False`` to log gradients. A shared network (``share_parameters``) and groups of one agent log
        theirs with ``batched=True`` too.
    """

    def _init_callback(self) -> None:
        gradient_save_freq, self.gradient_save_freq = self.gradient_save_freq, 0
        try:
            super()._init_callback()  # the config; the model.policy it would watch is not IPPO's
        finally:
            self.gradient_save_freq = gradient_save_freq
        if gradient_save_freq <= 0:
            return
        why_not = gradients_are_watchable(self.model)
        if why_not is not None:
            raise ValueError(
                f"WandbCallback(gradient_save_freq={gradient_save_freq}) cannot log this model's gradients: {why_not}. "
                "Build the model with batched=False and async_training=False to log them (the reference update, "
                "slower), or pass gradient_save_freq=0; every other metric is logged either way."
            )
        policies: dict[int, Any] = {}
        watched: dict[int, list[str]] = {}
        for agent, policy in self.model.policies.items():  # type: ignore[attr-defined]
            policies.setdefault(id(policy), policy)
            watched.setdefault(id(policy), []).append(str(agent))
        wandb.watch(list(policies.values()), log=self.log, log_freq=gradient_save_freq)
        names = [", ".join(agents) for agents in watched.values()]
        wandb.config.update({"watched_networks": names}, allow_val_change=True)
        self._watching = True

    def _on_rollout_start(self) -> None:
        self._commit_histograms()

    def _on_training_end(self) -> None:
        self._commit_histograms()
        super()._on_training_end()

    def _commit_histograms(self) -> None:
        """wandb.watch's hooks log their histograms without committing the row (they wait for the training loop's
        next wandb.log): after each update, commit them, since nothing else in IPPO.learn calls wandb.log."""
        if getattr(self, "_watching", False):
            wandb.log({}, commit=True)
