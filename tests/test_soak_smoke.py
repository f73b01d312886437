"""benchmarks/soak.py at a smoke size: a few seconds of training on failing env copies."""

from __future__ import annotations

import pytest

from tests.test_benchmarks_smoke import load_benchmark


@pytest.mark.usefixtures("no_hang")
def test_soak_smoke(capsys: pytest.CaptureFixture[str]) -> None:
    summary = load_benchmark("soak").main(
        ["--minutes", "0.04", "--warmup-minutes", "0.01", "--report-seconds", "0.5", "--n-envs", "2",
         "--raise-prob", "0.01", "--exit-prob", "0.002", "--net-arch", "16", "--n-epochs", "2"]
    )
    assert summary["env_steps"] > 0 and summary["updates"] > 0
    assert summary["env_restarts"] > 0, "the injected failures were survived"
    assert summary["save_load_ok"]
    assert summary["baseline_mb"] > 0 and summary["final_mb"] > 0
    report = capsys.readouterr().out
    assert "rss_MB" in report and "restarts survived" in report and "resident memory after" in report
