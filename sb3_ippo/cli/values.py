"""Option values: text -> Python (argparse types that turn every mistake into a usage error), and back (the
command that run.json records parses back into the same values)."""

from __future__ import annotations

import argparse
import importlib.util
from collections.abc import Callable, Sequence
from typing import Any

from sb3_ippo.common.env_factory import WrapperSpec
from sb3_ippo.hyperparams.text import integer, literal, parse_wrapper


def installed(package: str) -> bool:
    """Whether ``package`` can be imported (without importing it)."""
    try:
        return importlib.util.find_spec(package) is not None
    except (ImportError, ValueError):
        return False


def env_error(env_id: str, env_kwargs: dict[str, Any], wrappers: Sequence[WrapperSpec], error: Exception) -> str:
    """What failed when the env was made: the env, its arguments and wrappers, and the error (its type if mute)."""
    with_wrappers = f" and wrappers {' '.join(map(str, wrappers))}" if wrappers else ""
    cause = str(error) or f"{type(error).__name__} raised in the env or a wrapper"
    return f"cannot make the env {env_id} with env kwargs {env_kwargs}{with_wrappers}: {cause}"


def to_text(value: Any) -> str:
    """The option text that :func:`literal` (or the option's type) parses back into ``value``."""
    if isinstance(value, dict) and all(isinstance(key, str) and key.isidentifier() for key in value):
        return "dict(" + ", ".join(f"{key}={to_text(item)}" for key, item in value.items()) + ")"
    if isinstance(value, (list, tuple)):
        items = ", ".join(to_text(item) for item in value)
        return f"[{items}]" if isinstance(value, list) else f"({items}{',' if len(value) == 1 else ''})"
    if isinstance(value, type):
        return f"nn.{value.__name__}"
    if isinstance(value, str):
        return value
    return repr(value)


def jsonable(value: Any) -> Any:
    """``value`` for run.json: torch module classes (``activation_fn``) as their option text, tuples as lists."""
    if isinstance(value, dict):
        return {key: jsonable(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(item) for item in value]
    if isinstance(value, type):
        return to_text(value)
    return value


def _typed(function: Callable[[str], Any], expected: str) -> Callable[[str], Any]:
    """An argparse ``type`` that turns any failure into a usage error saying what was ``expected``."""

    def parse(text: str) -> Any:
        try:
            return function(text)
        except (ValueError, TypeError, SyntaxError, OverflowError) as error:
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r} ({error})") from None

    parse.__name__ = expected  # What argparse names in "invalid <type> value".
    return parse


def _at_least(minimum: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        value = integer(text)
        if value < minimum:
            raise ValueError(f"{value} < {minimum}")
        return value

    return parse


positive_int = _typed(_at_least(1), "a positive integer")
non_negative_int = _typed(_at_least(0), "an integer >= 0")


def _env_kwarg(text: str) -> tuple[str, Any]:
    key, sep, value = text.partition("=")
    if not sep or not key.isidentifier():
        raise ValueError("not KEY=VALUE")
    return key, literal(value)


env_kwarg = _typed(_env_kwarg, "KEY=VALUE (e.g. N=3 or continuous_actions=True)")
wrapper_spec = _typed(parse_wrapper, "a SuperSuit wrapper NAME or NAME:KEY=VALUE,... (e.g. resize:x_size=64,y_size=64)")


def _device(text: str) -> str:
    if text != "auto":
        import torch as th

        th.device(text)  # RuntimeError for an unknown device
    return text


def device(text: str) -> str:
    try:
        return _device(text)
    except RuntimeError as error:
        raise argparse.ArgumentTypeError(f"expected auto, cpu, cuda, cuda:N or mps, got {text!r} ({error})") from None
