"""What several test modules use: IPPO's update settings for calling the update functions directly, and the checks
of parameters and actions. Test modules import from here, never from each other."""

from __future__ import annotations

from typing import Any

from sb3_ippo import IPPO
from sb3_ippo.ippo.ippo import default_update_settings
from sb3_ippo.update.settings import UpdateSettings

GAMMA, GAE_LAMBDA = 0.99, 0.95


def settings(**overrides: Any) -> UpdateSettings:
    """IPPO's default update settings with the tests' discount (:data:`GAMMA`, :data:`GAE_LAMBDA`) and ``overrides``."""
    return default_update_settings(**{"gamma": GAMMA, "gae_lambda": GAE_LAMBDA, **overrides})


def stacked_groups(model: IPPO) -> set[str]:
    """The names of the model's groups whose members act and train as one batch (stacked networks)."""
    return {name for name, runner in model._runners.items() if runner.stacked is not None}
