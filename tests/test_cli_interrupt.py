"""Ctrl-C during ``python -m sb3_ippo train`` keeps the run: the model (loadable, trained as far as it got), the
learning curve and the logs are saved, one line says so and how to continue, the exit status is 130; ``train --resume
RUN_FOLDER`` continues the run up to its budget, appending to its progress.csv."""

from __future__ import annotations

import csv
import os
import pathlib
import signal
import subprocess
import sys
import time
from typing import Any

import pytest
from stable_baselines3.common.callbacks import BaseCallback

import sb3_ippo.cli.train
from sb3_ippo import IPPO
from sb3_ippo.cli import main
from tests.test_cli import QUICK, SMALL_ENV, TINY, usage_error

ROOT = pathlib.Path(__file__).resolve().parent.parent
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as a shell reports a command stopped by Ctrl-C


def rows(csv_path: pathlib.Path) -> list[dict[str, str]]:
    with csv_path.open() as file:
        return list(csv.DictReader(file))


def logged_rows(csv_path: pathlib.Path) -> list[dict[str, str]]:
    """The rows of a progress.csv being written (none yet if it does not exist)."""
    return rows(csv_path) if csv_path.is_file() else []


class CtrlCAt(BaseCallback):
    """Raises KeyboardInterrupt at the ``at_step``-th vectorized step, as Ctrl-C does wherever it strikes."""

    def __init__(self, at_step: int) -> None:
        super().__init__()
        self.at_step = at_step

    def _on_step(self) -> bool:
        if self.n_calls == self.at_step:
            raise KeyboardInterrupt
        return True


@pytest.fixture
def ctrl_c_at_step(monkeypatch: pytest.MonkeyPatch) -> None:
    """train's first ``learn`` is interrupted at its 60th vectorized step (120 env steps with 2 copies)."""
    make_callbacks = sb3_ippo.cli.train._callbacks
    calls = []

    def with_ctrl_c(*args: Any) -> tuple[list[Any], list[Any]]:
        callbacks, envs = make_callbacks(*args)
        calls.append(None)
        return ([*callbacks, CtrlCAt(60)] if len(calls) == 1 else callbacks), envs

    monkeypatch.setattr(sb3_ippo.cli.train, "_callbacks", with_ctrl_c)


@pytest.mark.usefixtures("ctrl_c_at_step")
def test_ctrl_c_saves_the_run_says_how_to_continue_and_resume_trains_up_to_the_budget(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run"
    budget = 300
    try:
        status = main(["train", "--out", str(out), *QUICK, "--timesteps", str(budget)])
    except KeyboardInterrupt:
        pytest.fail("Ctrl-C escaped the command line as a KeyboardInterrupt")
    assert status == EXIT_INTERRUPTED
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith(f"Interrupted at 120 of {budget} env steps: saved the model to {out / 'model.zip'}")
    assert err.endswith(f"continue with: python -m sb3_ippo train --resume {out}\n")
    assert {path.name for path in out.iterdir()} == {"model.zip", "learning_curve.png", "progress.csv", "run.json"}
    interrupted = IPPO.load(out / "model.zip")
    assert interrupted.num_timesteps == 120 and interrupted.policy_version >= 1
    logged = rows(out / "progress.csv")
    assert logged

    assert main(["train", "--resume", str(out)]) == 0
    assert "Resuming IPPO on mpe2.simple_spread_v3 {'N': 2, 'max_cycles': 10} at 120 of 300 env steps" in (
        capsys.readouterr().out
    )
    resumed = IPPO.load(out / "model.zip")
    assert resumed.num_timesteps >= budget and resumed.policy_version > interrupted.policy_version
    continued = rows(out / "progress.csv")
    assert continued[: len(logged)] == logged and len(continued) > len(logged)  # appended, the earlier rows kept
    steps = [int(row["time/total_timesteps"]) for row in continued]
    assert steps == sorted(steps) and steps[-1] > 120


def test_resume_takes_a_new_budget_and_refuses_other_options_and_a_finished_run(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run"
    main(["train", "--out", str(out), *QUICK])
    err = usage_error(capsys, ["train", "--resume", str(out)])
    assert f"argument --resume: {out} has trained its budget (100 env steps of --timesteps 100)" in err
    err = usage_error(capsys, ["train", "--resume", str(out), "--timesteps", "200", "--seed", "1"])
    assert "only --timesteps (a new budget) and --no-progress-bar go with --resume, not --seed" in err
    assert "has no run.json" in usage_error(capsys, ["train", "--resume", str(tmp_path)])
    assert main(["train", "--resume", str(out), "--timesteps", "200"]) == 0
    assert IPPO.load(out / "model.zip").num_timesteps >= 200


def test_an_out_that_holds_a_model_suggests_resume(tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run"
    main(["train", "--out", str(out), *QUICK])
    assert f"--resume {out} to continue it" in usage_error(capsys, ["train", "--out", str(out), *QUICK])


def test_a_ctrl_c_while_saving_is_deferred_and_a_second_leaves_the_earlier_file_whole(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from sb3_ippo.cli.interrupt import ctrl_c_deferred, written_whole

    model_file = tmp_path / "model.zip"
    model_file.write_text("the earlier model")
    with ctrl_c_deferred("the run"), written_whole(model_file) as partial:
        partial.write_text("half")
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.1)  # the handler runs between bytecodes; nothing is raised
        partial.write_text("the new model")
    assert model_file.read_text() == "the new model"
    assert "Still saving the run" in capsys.readouterr().err
    with pytest.raises(KeyboardInterrupt), ctrl_c_deferred("the run"), written_whole(model_file) as partial:
        partial.write_text("half")
        os.kill(os.getpid(), signal.SIGINT)
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.1)
    assert model_file.read_text() == "the new model"
    assert [path.name for path in tmp_path.iterdir()] == ["model.zip"]  # no partial file left
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_ctrl_c_in_a_terminal_keeps_the_run_without_a_traceback(tmp_path: pathlib.Path) -> None:
    # As a terminal does, SIGINT goes to the whole process group: the command and its learner process. It strikes
    # once progress.csv has a row of an applied update, whatever the machine's load.
    out = tmp_path / "run"
    command = [sys.executable, "-m", "sb3_ippo", "train", "--out", str(out), *SMALL_ENV, *TINY, "--n-envs", "2",
               "--timesteps", "1000000", "--async-training", "True", "--eval-episodes", "0"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                               start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not any(float(row.get("train/policy_version") or 0) >= 1 for row in logged_rows(out / "progress.csv")):
            assert process.poll() is None, process.communicate()
            assert time.monotonic() < deadline, "no progress.csv row in 120 s"
            time.sleep(0.1)
        os.killpg(process.pid, signal.SIGINT)
        _, stderr = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    assert process.returncode == EXIT_INTERRUPTED, stderr
    assert "Traceback" not in stderr and "Exception ignored" not in stderr, stderr
    assert stderr.startswith("Interrupted at ") and f"train --resume {out}" in stderr and stderr.count("\n") == 1
    model = IPPO.load(out / "model.zip")
    assert model.num_timesteps > 0 and model.policy_version >= 1
    assert (out / "learning_curve.png").is_file() and rows(out / "progress.csv")
