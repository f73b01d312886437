"""Speed as a user gets it: the README's Python snippet as written (torch's thread count untouched) against the same
snippet after ``torch.set_num_threads(1)`` and against the command line, each round in fresh processes.

Every variant trains IPPO's defaults on mpe2 ``simple_spread_v3`` (N=3, max_cycles=25) with 8 in-process copies for
``--timesteps`` env steps, seed 0:

- ``as_written``: the README's snippet (``make_vec_env(..., n_envs=8)``, ``IPPO("MlpPolicy", env, verbose=1)``,
  ``learn``), nothing else; stdout to a file, as a terminal would show it;
- ``one_thread``: the same, after ``torch.set_num_threads(1)`` (what every other figure in docs/benchmarks.md sets);
- ``cli``: ``python -m sb3_ippo train --timesteps T --no-progress-bar --eval-episodes 1`` (its ``--threads`` default,
  1); its speed is the last ``time/fps`` of progress.csv, which covers ``learn`` as the others' clocks do.

With ``--before CHECKOUT`` (a checkout of an earlier commit), ``before`` runs the snippet as written on that
checkout's ``sb3_ippo`` (``PYTHONPATH``), in the same alternating rounds.

The clock of the snippets covers ``learn`` only (not importing torch, nor building the env). Rounds alternate the
order of the variants; each figure is the median of ``--rounds``. ``--busy N`` starts N other processes that each spin
a core for the whole run (the "one other busy process" of issue 36 is ``--busy 1``).

    python benchmarks/as_written.py --rounds 2 --timesteps 30000
    python benchmarks/as_written.py --rounds 2 --timesteps 30000 --busy 1 [--before ../sb3_ippo_a144363]
"""

from __future__ import annotations

import argparse
import csv
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

SNIPPET = """
import time
{threads}
from mpe2 import simple_spread_v3
from sb3_ippo import IPPO, make_vec_env

env = make_vec_env(simple_spread_v3.parallel_env, n_envs=8, seed=0, env_kwargs=dict(N=3, max_cycles=25))
model = IPPO("MlpPolicy", env, verbose=1, seed=0)
start = time.perf_counter()
model.learn(total_timesteps={timesteps})
print("RATE", {timesteps} / (time.perf_counter() - start))
"""
VARIANTS = ("as_written", "one_thread", "cli")
BUSY_LOOP = "while True: pass"


def run_snippet(timesteps: int, one_thread: bool, out: Path, checkout: Path | None = None) -> float:
    threads = "import torch; torch.set_num_threads(1)" if one_thread else ""
    code = SNIPPET.format(threads=threads, timesteps=timesteps) + "import sb3_ippo; print('FROM', sb3_ippo.__file__)\n"
    env = dict(os.environ, PYTHONPATH=str(checkout.resolve())) if checkout is not None else None
    with open(out, "w") as stdout:
        # In the output's folder: python -c puts its working folder first on sys.path, before PYTHONPATH.
        subprocess.run([sys.executable, "-c", code], stdout=stdout, stderr=subprocess.STDOUT, check=True, env=env,
                       cwd=out.parent)
    lines = [line for line in out.read_text().splitlines() if line.startswith("RATE ")]
    return float(lines[-1].split()[1])


def run_cli(timesteps: int, folder: Path) -> float:
    command = [sys.executable, "-m", "sb3_ippo", "train", "--timesteps", str(timesteps), "--no-progress-bar",
               "--eval-episodes", "1", "--seed", "0", "--out", str(folder), "--overwrite"]
    subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    with open(folder / "progress.csv") as file:
        rows = [row for row in csv.DictReader(file) if row.get("time/fps")]
    return float(rows[-1]["time/fps"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--timesteps", type=int, default=30_000)
    parser.add_argument("--busy", type=int, default=0, help="other processes that each spin a core meanwhile")
    parser.add_argument("--before", type=Path, default=None, help="a checkout of an earlier commit: adds 'before'")
    args = parser.parse_args()

    variants = (*VARIANTS, "before") if args.before is not None else VARIANTS
    busy = [subprocess.Popen([sys.executable, "-c", BUSY_LOOP]) for _ in range(args.busy)]
    rates: dict[str, list[float]] = {variant: [] for variant in variants}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for round_index in range(args.rounds):
                order = variants if round_index % 2 == 0 else variants[::-1]
                for variant in order:
                    if variant == "cli":
                        rate = run_cli(args.timesteps, Path(tmp) / "cli")
                    elif variant == "before":
                        rate = run_snippet(args.timesteps, False, Path(tmp) / "before.txt", args.before)
                    else:
                        rate = run_snippet(args.timesteps, variant == "one_thread", Path(tmp) / f"{variant}.txt")
                    rates[variant].append(rate)
                    print(f"round {round_index + 1} {variant:>10}: {rate:,.0f} env steps/s", flush=True)
    finally:
        for process in busy:
            process.kill()
    load = os.getloadavg()[0]
    before = f"; before: the snippet as written on {args.before}" if args.before is not None else ""
    print(f"\n{args.rounds} alternating rounds of {args.timesteps:,} env steps, {args.busy} busy process(es), "
          f"load {load:.1f} at the end; IPPO's defaults on simple_spread (8 copies), each run a fresh process{before}")
    reference = statistics.median(rates["one_thread"])
    for variant in variants:
        median = statistics.median(rates[variant])
        print(f"{variant:>10}: {median:,.0f} env steps/s (median; {', '.join(f'{r:,.0f}' for r in rates[variant])}), "
              f"{median / reference:.2f}x one_thread")


if __name__ == "__main__":
    main()
