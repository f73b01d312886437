"""The benchmark scripts run, at a tiny size."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


def load_benchmark(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"benchmarks_{name}", BENCHMARKS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_env_throughput_smoke(capsys: pytest.CaptureFixture[str]) -> None:
    medians = load_benchmark("env_throughput").main(["--rounds", "2", "--steps", "5", "--n-envs", "2"])
    assert set(medians) == {"plain", "dummy", "subproc"} and all(rate > 0 for rate in medians.values())
    table = capsys.readouterr().out
    assert all(f"\n{name} " in table for name in medians) and "vs plain" in table
