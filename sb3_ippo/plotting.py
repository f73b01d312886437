"""The learning curve of a run, from SB3's CSV log: the team return and, beside it, each agent's return.

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
_AGENT_KEY = re.compile(r"rollout/(.+)/ep_rew_mean")


def read_curves(csv_path: pathlib.Path) -> dict[str, tuple[list[float], list[float]]]:
    """``{"team": (env steps, returns), agent: (env steps, returns), ...}`` from an SB3 ``progress.csv``; rows
    without a value for a curve are skipped. Agents are named as in the logger keys, in natural order."""
    curves: dict[str, tuple[list[float], list[float]]] = {}
    with csv_path.open() as file:
        for row in csv.DictReader(file):
            if not row.get(STEP_KEY):
                continue
            for key, value in row.items():
                match = _AGENT_KEY.fullmatch(key or "")
                name = "team" if key == TEAM_KEY else (match.group(1) if match else None)
                if name is None or not value:
                    continue
                steps, returns = curves.setdefault(name, ([], []))
                steps.append(float(row[STEP_KEY]))
                returns.append(float(value))
    team = {"team": curves.pop("team")} if "team" in curves else {}
    return {**team, **dict(sorted(curves.items(), key=lambda item: _natural_key(item[0])))}


def _natural_key(name: str) -> list[Any]:
    """``agent_2`` before ``agent_10``."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]


def plot_learning_curve(csv_path: pathlib.Path, png_path: pathlib.Path, title: str) -> bool:
    """One panel with the team return against env steps, and one per agent beside it. Returns False (and writes
    nothing) when the log holds no return to plot.

    :raises ImportError: without matplotlib.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curves = read_curves(csv_path)
    if "team" not in curves:
        return False
    n_columns = min(len(curves), 4)
    n_rows = math.ceil(len(curves) / n_columns)
    figure, axes = plt.subplots(
        n_rows, n_columns, figsize=(4.2 * n_columns, 3.2 * n_rows), sharex=True, squeeze=False
    )
    for axis, (name, (steps, returns)) in zip(axes.flat, curves.items(), strict=False):
        axis.plot(steps, returns, color="black" if name == "team" else None)
        axis.set_title("team return" if name == "team" else f"{name} return", fontsize=10)
        axis.grid(alpha=0.3)
    for axis in axes.flat[len(curves) :]:
        axis.set_visible(False)
    for axis in axes[-1]:
        axis.set_xlabel("env steps")
    for row in axes:
        row[0].set_ylabel("mean of last episodes")
    figure.suptitle(title)
    figure.tight_layout()
    figure.savefig(png_path, dpi=100)
    plt.close(figure)
    return True
