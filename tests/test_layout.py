"""The package's layout (issue 33): few top-level modules, no import circle between files, arrows from the algorithms
down into the shared machinery and never back, short files, and the old module paths still importable."""

from __future__ import annotations

import ast
import importlib
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "sb3_ippo"
MAX_TOP_LEVEL_MODULES = 8
MAX_FILE_LINES = 600
ALGORITHMS = ("sb3_ippo.ippo", "sb3_ippo.mappo")
SHARED = ("sb3_ippo.common", "sb3_ippo.update", "sb3_ippo.vec_env", "sb3_ippo.games", "sb3_ippo.serialization")


def module_files() -> dict[str, pathlib.Path]:
    """Every module of the package by its dotted name (a package by its ``__init__.py``)."""
    modules = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


def _known(name: str, modules: dict[str, pathlib.Path]) -> str | None:
    """The module ``name`` is, or the deepest known module it is an attribute of."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def imported_modules(module: str, path: pathlib.Path, modules: dict[str, pathlib.Path]) -> set[str]:
    """The package's modules that ``module`` imports anywhere in its file: at the top, in a function, or under
    ``if TYPE_CHECKING:`` (an import for type hints is an arrow between files all the same)."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    imported: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                source = ".".join([*base, node.module] if node.module else base)
            else:
                source = node.module or ""
            names = [f"{source}.{alias.name}" for alias in node.names]
        else:
            continue
        for name in names:
            if name == "sb3_ippo" or name.startswith("sb3_ippo."):
                found = _known(name, modules)
                if found is not None and found != module:
                    imported.add(found)
    return imported


def import_graph() -> dict[str, set[str]]:
    modules = module_files()
    return {module: imported_modules(module, path, modules) for module, path in modules.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle of ``graph`` (its modules in order, the first repeated at the end), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(module: str) -> list[str] | None:
        state[module] = 1
        path.append(module)
        for imported in sorted(graph.get(module, ())):
            if state.get(imported) == 1:
                return [*path[path.index(imported) :], imported]
            if imported not in state:
                cycle = visit(imported)
                if cycle is not None:
                    return cycle
        path.pop()
        state[module] = 2
        return None

    for module in sorted(graph):
        if module not in state:
            cycle = visit(module)
            if cycle is not None:
                return cycle
    return None


def test_the_cycle_finder_finds_a_circle_of_three_and_none_in_a_tree() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_no_two_files_of_the_package_import_each_other_even_through_others() -> None:
    cycle = find_cycle(import_graph())
    assert cycle is None, "import circle: " + " -> ".join(cycle or [])


def test_the_shared_machinery_never_imports_an_algorithm() -> None:
    upward = sorted(
        f"{module} -> {imported}"
        for module, imports in import_graph().items()
        if module.startswith(SHARED)
        for imported in imports
        if imported.startswith(ALGORITHMS)
    )
    assert upward == []


def test_at_most_8_modules_at_the_package_top_level() -> None:
    top_level = sorted(path.name for path in PACKAGE.glob("*.py"))
    assert len(top_level) <= MAX_TOP_LEVEL_MODULES, top_level


def test_no_file_of_the_package_is_over_600_lines() -> None:
    lines = {str(path.relative_to(ROOT)): len(path.read_text().splitlines()) for path in PACKAGE.rglob("*.py")}
    assert {name: n for name, n in lines.items() if n > MAX_FILE_LINES} == {}


@pytest.mark.parametrize("old_path", sorted(importlib.import_module("sb3_ippo.old_paths").MOVED_MODULES))
def test_an_old_module_path_gives_the_names_of_the_module_that_holds_them_now(old_path: str) -> None:
    from sb3_ippo.old_paths import MOVED_MODULES

    old, new = importlib.import_module(old_path), importlib.import_module(MOVED_MODULES[old_path])
    public = [name for name in vars(new) if not name.startswith("_")]
    assert public
    assert all(getattr(old, name) is getattr(new, name) for name in public)


def test_the_class_paths_that_saved_zips_name_still_resolve() -> None:
    # What the zips of tests/data and of the code before issue 33 pickle (found by reading their pickles).
    import pickle

    from sb3_ippo.common.normalization import ObservationNormalizer, ReturnNormalizer
    from sb3_ippo.mappo.policies import CentralCriticPolicy
    from sb3_ippo.update.ppo import UpdateStats

    expected = {
        ("sb3_ippo.normalization", "ObservationNormalizer"): ObservationNormalizer,
        ("sb3_ippo.normalization", "ReturnNormalizer"): ReturnNormalizer,
        ("sb3_ippo.ppo_update", "UpdateStats"): UpdateStats,
        ("sb3_ippo.update.ppo", "UpdateStats"): UpdateStats,
        ("sb3_ippo.mappo.policies", "CentralCriticPolicy"): CentralCriticPolicy,
    }
    for (module, name), cls in expected.items():
        found = pickle.loads(f"c{module}\n{name}\n.".encode())  # the GLOBAL opcode a pickle names a class with
        assert found is cls, (module, name)


def test_the_map_in_algorithm_md_names_only_modules_that_exist() -> None:
    text = (ROOT / "docs" / "algorithm.md").read_text()
    section = text[text.index("## Where the code is") : text.index("**Adding an algorithm**")]
    named, folder = set(), ""
    for row in (line for line in section.splitlines() if line.startswith("|") and not line.startswith("|---")):
        cells = [cell.strip() for cell in row.split("|")[1:-1]]
        if cells[0].startswith("`") and cells[0].endswith("/`"):
            folder = cells[0].strip("`")  # a row of the package table; "| |" rows continue the package above
        elif cells[0]:
            folder = ""  # a row of the steps table: paths from the package's root
        for cell in cells[1:3]:
            for word in cell.replace(",", " ").replace("(", " ").replace(")", " ").split():
                if word.startswith("`") and word.endswith(".py`"):
                    name = word.strip("`")
                    named.add(name if "/" in name else folder + name)
    assert {"common/base_class.py", "common/on_policy_algorithm.py", "update/runners.py", "games/masking.py"} <= named
    assert sorted(name for name in named if not (PACKAGE / name).is_file()) == []
