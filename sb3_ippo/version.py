"""The package's version, the one place it is written: ``sb3_ippo.__version__``, the wheel's metadata
(``pyproject.toml`` reads it here), model files and ``run.json`` record it. A module of its own, importing nothing, so
that the code that records it imports no part of the package above it."""

__version__ = "0.1.0"
