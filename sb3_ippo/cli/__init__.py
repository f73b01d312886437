"""Command line: ``python -m sb3_ippo train`` and ``python -m sb3_ippo evaluate MODEL.zip|MODEL.safetensors|RUN_FOLDER``.

Every bad value is an argparse usage error (exit status 2: what was wrong and what was expected, then a one-line
usage hint), never a traceback. Ctrl-C during ``train`` saves the run and exits with status 130 (``cli.interrupt``);
``train --resume RUN_FOLDER`` continues it. ``train`` writes into ``--out``: ``model.zip``, ``progress.csv`` (SB3's
CSV log, one row per update), ``learning_curve.png`` (with matplotlib) and ``run.json``, which holds every setting
(the hyperparameters with their defaults) and the exact command that re-runs the same training.

One module per part: ``values`` (text <-> values, argparse types), ``settings`` (command line > hyperparameter file
> defaults; run.json), ``parser``, ``train``, ``evaluate``, ``interrupt`` (Ctrl-C).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from sb3_ippo.cli import evaluate, train
from sb3_ippo.cli.interrupt import EXIT_INTERRUPTED, RunInterrupted
from sb3_ippo.cli.parser import build_parser, parse_args
from sb3_ippo.cli.values import to_text, wrapper_spec
from sb3_ippo.hyperparams.text import literal

__all__ = ["literal", "main", "to_text", "wrapper_spec"]


def main(argv: Sequence[str] | None = None) -> int:
    # pygame (butterfly envs, rendering) needs no display with the dummy video driver.
    if "DISPLAY" not in os.environ:
        os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
    os.environ.setdefault("PYGAME_HIDE_SUPPORT_PROMPT", "1")
    try:
        parsers = build_parser()
        args = parse_args(parsers, argv)
        if args.command == "train":
            train.train(args, parsers.train)
        else:
            evaluate.evaluate(args, parsers.evaluate)
    except RunInterrupted as interruption:
        print(interruption, file=sys.stderr)
        return EXIT_INTERRUPTED
    except KeyboardInterrupt:
        print("Interrupted (Ctrl-C)", file=sys.stderr)
        return EXIT_INTERRUPTED
    return 0
