"""Turn-based games (PettingZoo's AEC envs, the classic family): AEC env copies stepped turn by turn, action masks,
frozen opponents and self-play, and evaluation by win, draw and loss rates. The names load on first use (PEP 562),
so that the modules here that the shared machinery needs (:mod:`~sb3_ippo.games.masking`) load alone.

- :mod:`~sb3_ippo.games.turn_based`: :class:`TurnBasedMultiAgentVecEnv`, copies of AEC games;
- :mod:`~sb3_ippo.games.masking`: action masks and the maskable policies;
- :mod:`~sb3_ippo.games.self_play`: opponents (``opponents=``) and the self-play pool (``self_play_pool=``);
- :mod:`~sb3_ippo.games.evaluation`: :func:`evaluate_game`, a model's win, draw and loss rates in each seat.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sb3_ippo.games.evaluation import SeatRecord, evaluate_game, outcome
    from sb3_ippo.games.self_play import CallableOpponent, ModelOpponent, Opponent, RandomOpponent, SelfPlayPool

__all__ = [
    "CallableOpponent",
    "ModelOpponent",
    "Opponent",
    "RandomOpponent",
    "SeatRecord",
    "SelfPlayPool",
    "evaluate_game",
    "outcome",
]

_MODULES = {
    "SeatRecord": "sb3_ippo.games.evaluation",
    "evaluate_game": "sb3_ippo.games.evaluation",
    "outcome": "sb3_ippo.games.evaluation",
    "CallableOpponent": "sb3_ippo.games.self_play",
    "ModelOpponent": "sb3_ippo.games.self_play",
    "Opponent": "sb3_ippo.games.self_play",
    "RandomOpponent": "sb3_ippo.games.self_play",
    "SelfPlayPool": "sb3_ippo.games.self_play",
}


def __getattr__(name: str) -> Any:
    if name in _MODULES:
        return getattr(importlib.import_module(_MODULES[name]), name)
    raise AttributeError(f"module 'sb3_ippo.games' has no attribute {name!r}")
