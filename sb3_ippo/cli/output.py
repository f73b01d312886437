"""What ``python -m sb3_ippo train`` shows while it trains: SB3's logger with, on stdout, one summary line at a steady
interval of env steps (``--verbose 1``, the default) or SB3's full table (``--verbose 2``); progress.csv and
TensorBoard get every key of every dump whatever the verbosity."""

from __future__ import annotations

import os
import pathlib
from typing import Any

from stable_baselines3.common.logger import CSVOutputFormat, KVWriter, Logger, SeqWriter, TensorBoardOutputFormat

from sb3_ippo.cli.settings import TrainSettings
from sb3_ippo.common.logs import ThrottledHumanOutputFormat, is_due


class SummaryLineOutputFormat(KVWriter, SeqWriter):
    """One line per :func:`sb3_ippo.common.logs.is_due` dump: env steps against the budget, the team return (for a game,
    whose team return is 0 whoever wins, the last win rate against a random player instead, when ``--eval-freq``
    measured one), the episode length, the policy version, the approximate KL and the speed. Messages of
    ``logger.log`` are printed as they come. Each value is the latest logged: an evaluation's dump (``--eval-freq``)
    holds no rollout keys."""

    def __init__(self, every: int, total_timesteps: int, game: bool) -> None:
        self.every = every
        self.total_timesteps = total_timesteps
        self.game = game
        self.last_step: int | None = None
        self.latest: dict[str, Any] = {}

    def write(self, key_values: dict[str, Any], key_excluded: dict[str, tuple[str, ...]], step: int = 0) -> None:
        self.latest.update(key_values)
        if not is_due(self.every, self.last_step, step):
            return
        self.last_step = step
        print(self.line(self.latest, step), flush=True)

    def line(self, key_values: dict[str, Any], step: int) -> str:
        width = len(f"{self.total_timesteps:,}")
        parts = [f"{step:>{width},}/{self.total_timesteps:,} env steps"]
        if self.game:
            win_rate = key_values.get("eval/win_rate")
            parts.append("win rate vs random " + ("-" if win_rate is None else f"{win_rate:.0%}"))
        elif "rollout/ep_rew_mean" in key_values:
            parts.append(f"team return {key_values['rollout/ep_rew_mean']:.2f}")
        if "eval/mean_reward" in key_values and not self.game:
            parts.append(f"eval {key_values['eval/mean_reward']:.2f}")
        if "rollout/ep_len_mean" in key_values:
            parts.append(f"episode length {key_values['rollout/ep_len_mean']:.1f}")
        else:
            parts.append("no episode finished yet")
        if "train/policy_version" in key_values:
            parts.append(f"policy_version {key_values['train/policy_version']}")
        if "train/approx_kl" in key_values:
            parts.append(f"approx_kl {key_values['train/approx_kl']:.4f}")
        if "time/fps" in key_values:
            parts.append(f"{key_values['time/fps']:,} env steps/s")
        return " | ".join(parts)

    def write_sequence(self, sequence: list[Any]) -> None:
        print(" ".join(map(str, sequence)), flush=True)

    def close(self) -> None:
        pass


class ContinuedCSVOutputFormat(CSVOutputFormat):
    """SB3's CSV log continuing an existing file (``train --resume``): its rows stay, new rows follow under its header,
    and a key it did not have yet is added as SB3 adds one (the header and earlier rows rewritten with an empty
    column)."""

    def __init__(self, filename: str) -> None:
        # Not CSVOutputFormat.__init__, which opens the file with "w+" and so empties it.
        self.file = open(filename, "r+")  # closed by close(), as in SB3
        header = self.file.readline().rstrip("\n")
        self.keys = header.split(",") if header else []
        self.file.seek(0, os.SEEK_END)
        self.separator = ","
        self.quotechar = '"'


def make_logger(settings: TrainSettings, game: bool, append: bool = False) -> Logger:
    """SB3 logger: on stdout the summary line (``--verbose 1``) or the full table (``--verbose 2``), every
    ``--print-every`` env steps; progress.csv in ``--out`` and TensorBoard under ``--tensorboard-log`` get every
    dump and every key. With ``append``, progress.csv keeps the rows it has (a resumed run)."""
    out = pathlib.Path(settings.out)
    csv_path = out / "progress.csv"
    csv_format = ContinuedCSVOutputFormat if append and csv_path.is_file() else CSVOutputFormat
    formats: list[KVWriter] = [csv_format(str(csv_path))]
    if settings.verbose == 1:
        formats.insert(0, SummaryLineOutputFormat(settings.print_every, settings.timesteps, game))
    elif settings.verbose >= 2:
        formats.insert(0, ThrottledHumanOutputFormat(settings.print_every))
    if settings.tensorboard_log is not None:
        from stable_baselines3.common.utils import get_latest_run_id

        name = settings.algorithm_name  # IPPO or MAPPO
        run_id = get_latest_run_id(settings.tensorboard_log, name) + 1
        formats.append(TensorBoardOutputFormat(os.path.join(settings.tensorboard_log, f"{name}_{run_id}")))
    return Logger(folder=str(out), output_formats=formats)
