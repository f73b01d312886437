"""benchmarks/recompute_share.py runs, at a tiny size, and reports a share for both variants."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "recompute_share.py"


def test_recompute_share_smoke(capsys: pytest.CaptureFixture[str]) -> None:
    spec = importlib.util.spec_from_file_location("benchmarks_recompute_share", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)

    results = module.main(["--rounds", "2", "--trajectories", "4", "--steps", "8", "--n-epochs", "3", "--threads", "1"])

    assert set(results) == {"target_kl=None", "target_kl=0.01"}
    assert results["target_kl=None"]["epochs"] == 3
    for medians in results.values():
        assert 0 < medians["recompute"] < medians["build_batch"] < medians["update"]
        assert 0 < medians["share"] < 1
    table = capsys.readouterr().out
    assert "target_kl=None" in table and "target_kl=0.01" in table and "share" in table
