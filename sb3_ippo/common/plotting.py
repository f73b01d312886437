"""The learning curve of a run, from SB3's CSV log: the team return and, beside it, each agent's return; for a game
(turn-based env, whose team return is 0 whoever wins), the win rate against a random player instead.

Needs matplotlib (``pip install matplotlib``), which the library itself does not: callers catch the ImportError.
"""

from __future__ import annotations

import csv
import math
import pathlib
import re
from typing import Any

TEAM_KEY = "rollout/ep_rew_mean"
STEP_KEY = "time/total_timesteps"
WIN_RATE_KEY = "eval/win_rate"  # MultiAgentEvalCallback(opponent="random"): the mean over the seats
_AGENT_KEY = re.compile(r"rollout/(.+)/ep_rew_mean")
_SEAT_WIN_RATE_KEY = re.compile(r"eval/(.+)/win_rate")


def read_curves(csv_path: pathlib.Path, game: bool = False) -> dict[str, tuple[list[float], list[float]]]:
    """``{"team": (env steps, values), agent: (env steps, values), ...}`` from an SB3 ``progress.csv``: the returns,
    or with ``game`` the win rates (``eval/win_rate`` as "team", ``eval/<seat>/win_rate`` per seat); rows without a
    value for a curve are skipped. Agents are named as in the logger keys, in natural order."""
    team_key, agent_key = (WIN_RATE_KEY, _SEAT_WIN_RATE_KEY) if game else (TEAM_KEY, _AGENT_KEY)
    curves: dict[str, tuple[list[float], list[float]]] = {}
    with csv_path.open() as file:
        for row in csv.DictReader(file):
            if not row.get(STEP_KEY):
                continue
            for key, value in row.items():
                match = agent_key.fullmatch(key or "")
                name = "team" if key == team_key else (match.group(1) if match else None)
                if name is None or not value:
                    continue
                steps, values = curves.setdefault(name, ([], []))
                steps.append(float(row[STEP_KEY]))
                values.append(float(value))
    team = {"team": curves.pop("team")} if "team" in curves else {}
    return {**team, **dict(sorted(curves.items(), key=lambda item: _natural_key(item[0])))}


def _natural_key(name: str) -> list[Any]:
    """``agent_2`` before ``agent_10``."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]


def env_steps_label(steps: float, _position: Any = None) -> str:
    """A short tick label: 200k, 1.5M (full numbers overlap on narrow panels)."""
    for size, suffix in ((1e6, "M"), (1e3, "k")):
        if abs(steps) >= size:
            return f"{steps / size:.4g}{suffix}"
    return f"{steps:.4g}"


def plot_learning_curve(csv_path: pathlib.Path, png_path: pathlib.Path, title: str, game: bool = False) -> bool:
    """One panel with the team return against env steps, and one per agent beside it; with ``game``, one panel with
    the win rate against a random player (the mean over the seats, and each seat's). Returns False (and writes
    nothing) when the log holds nothing to plot.

    :raises ImportError: without matplotlib.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, MaxNLocator

    curves = read_curves(csv_path, game)
    if "team" not in curves:
        return False
    if game:
        figure, axis = plt.subplots(figsize=(6.4, 4.0))
        for name, (steps, rates) in curves.items():
            style = {"color": "black", "linewidth": 2} if name == "team" else {"alpha": 0.8}
            axis.plot(steps, rates, marker="o", markersize=3, label="mean over the seats" if name == "team" else name,
                      **style)
        axis.set_ylim(-0.02, 1.02)
        axis.set_ylabel("win rate against a random player")
        axis.legend(fontsize=8)
        axes = [axis]
    else:
        n_columns = min(len(curves), 4)
        n_rows = math.ceil(len(curves) / n_columns)
        figure, grid = plt.subplots(
            n_rows, n_columns, figsize=(4.2 * n_columns, 3.2 * n_rows), sharex=True, squeeze=False
        )
        for axis, (name, (steps, returns)) in zip(grid.flat, curves.items(), strict=False):
            axis.plot(steps, returns, color="black" if name == "team" else None)
            axis.set_title("team return" if name == "team" else f"{name} return", fontsize=10)
        for axis in grid.flat[len(curves) :]:
            axis.set_visible(False)
        for row in grid:
            row[0].set_ylabel("mean of last episodes")
        axes = list(grid.flat[: len(curves)])
    for axis in axes:
        axis.grid(alpha=0.3)
        axis.xaxis.set_major_locator(MaxNLocator(nbins=5))
        axis.xaxis.set_major_formatter(FuncFormatter(env_steps_label))
        axis.set_xlabel("env steps")
    figure.suptitle(title)
    figure.tight_layout()
    figure.savefig(png_path, dpi=100)
    plt.close(figure)
    return True
