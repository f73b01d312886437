"""Hyperparameter values written as text, in rl-zoo's notation and as Python literals: ``lin_1e-3`` (a linear
schedule), ``dict(net_arch=[64, 64], activation_fn=nn.ReLU)``, ``2e5``. The command line's options and the
hyperparameter files (the packaged tuned settings and a user's ``--hyperparams`` file) are read by these, so that
a value means the same wherever it is written."""

from __future__ import annotations

import argparse
import ast
import re
from collections.abc import Callable
from typing import Any

from sb3_ippo.common.env_factory import WrapperSpec
from sb3_ippo.hyperparams.validation import check_hyperparameter

_SCHEDULE = re.compile(r"lin_(.+)")
_TORCH_NN = re.compile(r"(?:(?:th|torch)\.)?nn\.(\w+)")


def _node_value(node: ast.AST) -> Any:
    """A literal, ``dict(key=value, ...)`` or a torch activation such as ``nn.ReLU`` (for ``activation_fn``)."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "dict" and not node.args:
        return {keyword.arg: _node_value(keyword.value) for keyword in node.keywords}
    if isinstance(node, ast.Dict):
        return {_node_value(key): _node_value(value) for key, value in zip(node.keys, node.values, strict=True)}  # type: ignore[arg-type]
    if isinstance(node, (ast.List, ast.Tuple)):
        values = [_node_value(element) for element in node.elts]
        return values if isinstance(node, ast.List) else tuple(values)
    match = _TORCH_NN.fullmatch(ast.unparse(node)) if isinstance(node, ast.Attribute) else None
    if match is not None:
        from torch import nn

        module = getattr(nn, match.group(1), None)
        if isinstance(module, type) and issubclass(module, nn.Module):
            return module
        raise ValueError(f"torch.nn has no module {match.group(1)!r}")
    try:
        return ast.literal_eval(node)
    except ValueError:
        raise ValueError(f"{ast.unparse(node)} is not a Python literal") from None


def literal(text: str) -> Any:
    """A Python literal (number, bool, None, list, dict, ``dict(key=literal, ...)``), or the text itself."""
    try:
        return _node_value(ast.parse(text, mode="eval").body)
    except (ValueError, SyntaxError, TypeError):
        return text


def integer(text: str) -> int:
    """An integer, also written as ``2e5`` or ``200_000``."""
    try:
        return int(text)
    except ValueError:
        number = float(text)
        if not number.is_integer():
            raise ValueError(f"{text} is not a whole number") from None
        return int(number)


def _keyword_value(node: ast.AST) -> Any:
    try:
        return _node_value(node)
    except ValueError:
        return ast.unparse(node)  # a bare word: dtype=float32


def parse_wrapper(text: str) -> WrapperSpec:
    name, _, arguments = text.partition(":")
    kwargs = {}
    if arguments:
        # Parsed as a Python call's keyword arguments, so that values may hold commas: reshape:shape=(84,84,1)
        call = ast.parse(f"_({arguments})", mode="eval").body
        if not isinstance(call, ast.Call) or call.args or any(keyword.arg is None for keyword in call.keywords):
            raise ValueError("its arguments are KEY=VALUE,...")
        kwargs = {str(keyword.arg): _keyword_value(keyword.value) for keyword in call.keywords}
    spec = WrapperSpec(name, kwargs)
    spec.resolve()  # Unknown wrapper, unknown or missing argument: a usage error now, not a failure in a worker.
    return spec


def _boolean(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("true", "1", "yes", "on"):
        return True
    if lowered in ("false", "0", "no", "off"):
        return False
    raise ValueError("not a boolean")


def _boolean_or_dict(text: str) -> bool | dict[str, Any]:
    return _dict(text) if text.strip().startswith(("{", "dict(")) else _boolean(text)


def _number(text: str) -> float:
    return float(text)


def _number_or_schedule(text: str) -> float | str:
    match = _SCHEDULE.fullmatch(text.strip())
    if match:
        float(match.group(1))  # lin_<initial value>: linear decay to 0, as in rl-zoo
        return text.strip()
    return float(text)


def _dict(text: str) -> dict[str, Any]:
    value = _node_value(ast.parse(text, mode="eval").body)
    if not isinstance(value, dict):
        raise ValueError("not a dict")
    return value


def schedule(value: Any) -> Any:
    """``"lin_3e-4"`` -> SB3's ``LinearSchedule`` from 3e-4 down to 0 over the run (rl-zoo's notation); else ``value``."""
    match = _SCHEDULE.fullmatch(value) if isinstance(value, str) else None
    if match is None:
        return value
    from stable_baselines3.common.utils import LinearSchedule

    return LinearSchedule(start=float(match.group(1)), end=0.0, end_fraction=1.0)


def _boolean_or_auto(text: str) -> bool | str:
    return "auto" if text.strip().strip("'\"").lower() == "auto" else _boolean(text)


def hyperparameter_type(name: str, annotation: str) -> Callable[[str], Any]:
    """The argparse ``type`` of an IPPO hyperparameter, from its annotation; the value is validated as IPPO does."""
    base: Callable[[str], Any]
    if "Schedule" in annotation:
        base, expected = _number_or_schedule, "a number or lin_<number> (a linear schedule)"
    elif annotation.startswith("bool") and "auto" in annotation:
        base, expected = _boolean_or_auto, 'True, False or "auto"'
    elif annotation.startswith("bool") and "Mapping" in annotation:
        base, expected = _boolean_or_dict, 'True, False or a dict, e.g. "{\'agent\': True}"'
    elif annotation.startswith("bool"):
        base, expected = _boolean, "True or False"
    elif annotation.startswith("int"):
        base, expected = integer, "an integer"
    elif annotation.startswith("float"):
        base, expected = _number, "a number"
    elif annotation.startswith("dict"):
        base, expected = _dict, 'a dict, e.g. "dict(net_arch=[64, 64])"'
    else:
        base, expected = literal, "a value"
    optional = "None" in annotation

    def parse(text: str) -> Any:
        if optional and text.strip().lower() in ("none", "null"):
            value = None
        else:
            try:
                value = base(text)
            except (ValueError, TypeError, SyntaxError, OverflowError) as error:
                none = " or None" if optional else ""
                raise argparse.ArgumentTypeError(f"expected {expected}{none}, got {text!r} ({error})") from None
        try:
            check_hyperparameter(name, schedule(value))
        except ValueError as error:
            raise argparse.ArgumentTypeError(str(error)) from None
        return value

    parse.__name__ = name
    return parse
