"""The import graph of src/ragen2 points one way: no module imports, directly or through others, a module that
imports it back, and no package of ragen2 one that imports it back (docs/architecture.md).

The graph is read from the source with ``ast``, without importing anything. Every import counts, at the top
of a module and inside a function alike: an import deferred into a function (to keep ``--help`` free of
torch) still depends on what it imports, only later. Imports under ``if TYPE_CHECKING:`` do not count (they
never run). Importing ``a.b.c`` runs ``a/__init__`` and ``a/b/__init__`` first, so it depends on those too,
except on the packages that hold the importing module (they are initialised before it).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def modules(package: Path) -> dict[str, Path]:
    """Every module of ``package`` (a source folder) by dotted name; a package by its own name."""
    found = {}
    for path in package.rglob("*.py"):
        parts = list(path.relative_to(package.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _imported(tree: ast.AST, package: str) -> Iterator[str]:
    """The dotted names ``tree`` imports (``from a import b`` gives ``a.b``), relative ones resolved against
    ``package``, skipping ``if TYPE_CHECKING:`` blocks."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            continue
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parent, *([node.module] if node.module else [])])
            yield base
            yield from (f"{base}.{alias.name}" for alias in node.names)
        yield from _imported(node, package)


def import_graph(found: Mapping[str, Path]) -> dict[str, set[str]]:
    """Module -> the modules of ``found`` it imports, and the packages above each of them it does not sit in."""
    graph = {}
    for name, path in found.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        own = {".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 2)}
        targets = set()
        for dotted in _imported(ast.parse(path.read_text()), package):
            parts = dotted.split(".")
            targets |= {".".join(parts[:i]) for i in range(1, len(parts) + 1)}
        graph[name] = {t for t in targets if t in found and t not in own}
    return graph


def cycle(graph: Mapping[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as the path that closes it (``[a, b, a]``), or None when there is none."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for target in sorted(graph.get(node, ())):
            if state.get(target) == 1:
                return [*path[path.index(target) :], target]
            if target not in state and (found := visit(target)) is not None:
                return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)) is not None:
            return found
    return None


def packages(graph: Mapping[str, set[str]]) -> dict[str, set[str]]:
    """The graph between ragen2's parts (``ragen2.data``, ``ragen2.config``, …): the first two parts of each
    name, edges within a part left out."""
    part = {name: ".".join(name.split(".")[:2]) for name in graph}
    folded: dict[str, set[str]] = {p: set() for p in part.values()}
    for name, targets in graph.items():
        folded[part[name]] |= {part[t] for t in targets} - {part[name]}
    return folded


GRAPH = import_graph(modules(ROOT / "src" / "ragen2"))


def test_the_graph_is_read_from_every_module() -> None:
    # the known edges of the layers: the graph sees both kinds of import, and the package inits
    assert "ragen2.config" in GRAPH["ragen2.cli"]  # at the top of the module
    assert "ragen2.data.rollout_config" in GRAPH["ragen2.config"]  # inside a function
    assert "ragen2.agent" in GRAPH["ragen2.data.batch"]  # the package of an imported module
    assert "ragen2.data" not in GRAPH["ragen2.data.batch"]  # not its own package
    assert not GRAPH["ragen2.errors"]  # the leaf every refusal imports


def test_no_import_cycle_in_ragen2() -> None:
    assert cycle(GRAPH) is None, " -> ".join(cycle(GRAPH) or [])


def test_no_cycle_between_the_parts_of_ragen2() -> None:
    parts = packages(GRAPH)
    assert cycle(parts) is None, " -> ".join(cycle(parts) or [])


@pytest.mark.parametrize(
    ("lower", "upper"),
    [
        ("ragen2.errors", "ragen2.config"),
        ("ragen2.settings", "ragen2.config"),
        ("ragen2.models", "ragen2.config"),
        ("ragen2.algos", "ragen2.data"),
        ("ragen2.agent", "ragen2.data"),
        ("ragen2.rollout", "ragen2.agent"),
        ("ragen2.data", "ragen2.modules"),
        ("ragen2.modules", "ragen2.callbacks"),
        ("ragen2.config", "ragen2.cli"),
    ],
)
def test_a_lower_layer_reaches_no_upper_one(lower: str, upper: str) -> None:
    # the order docs/architecture.md names: nothing below reaches what is above, not even through others
    parts = packages(GRAPH)
    reached, todo = set(), [lower]
    while todo:
        for target in parts[todo.pop()] - reached:
            reached.add(target)
            todo.append(target)
    assert upper not in reached


def test_the_cycle_finder_finds_one() -> None:
    assert cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None


def test_a_function_local_import_closes_a_cycle(tmp_path: Path) -> None:
    # the cycle config.py closed before it had a leaf for ConfigError: config -> resume (inside a function)
    # -> models.loading -> config
    package = tmp_path / "pkg"
    (package / "models").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "models" / "__init__.py").write_text("")
    (package / "config.py").write_text("def run_folders():\n    from pkg.resume import checkpoint_dir\n")
    (package / "resume.py").write_text("from pkg.models.loading import load\n")
    (package / "models" / "loading.py").write_text("from ..config import ConfigError\n")
    found = import_graph(modules(package))
    assert cycle(found) == ["pkg.config", "pkg.resume", "pkg.models.loading", "pkg.config"]


def test_ragen2_envs_imports_nothing_of_ragen2() -> None:
    graph = import_graph({**modules(ROOT / "envs" / "ragen2_envs"), **modules(ROOT / "src" / "ragen2")})
    envs = {name for name in graph if name.startswith("ragen2_envs")}
    assert not [t for name in envs for t in graph[name] if t == "ragen2" or t.startswith("ragen2.")]


def test_every_public_name_of_ragen2_data_loads_from_its_module() -> None:
    import ragen2.data as data

    assert sorted(data._MODULE) == sorted(data.__all__)
    for name in data.__all__:
        assert getattr(data, name).__module__ == f"ragen2.data.{data._MODULE[name]}", name
    with pytest.raises(AttributeError, match="has no attribute 'RolloutDatamodule'"):
        data.RolloutDatamodule  # noqa: B018  (the misspelt name is read to raise)


def test_a_config_error_is_found_before_lightning_loads(tmp_path: Path) -> None:
    """The config checks read ``ragen2.data``'s ``EnvConfig`` but load no Lightning (seconds of imports): a
    typo on the command line is answered at once. In a fresh process, as a command line starts."""
    code = (
        "import sys\n"
        "from ragen2.config import compose, validate\n"
        "from ragen2.errors import ConfigError\n"
        f"cfg = compose(['model=tiny', '+env.kwargs.sucess_rate=0.5'], run_dir={str(tmp_path)!r})\n"
        "try:\n"
        "    validate(cfg)\n"
        "except ConfigError as err:\n"
        "    print(str(err).split('.')[0])\n"
        "print(sorted(m for m in sys.modules if m == 'lightning' or m.startswith('lightning.')))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    said, loaded = done.stdout.splitlines()
    assert said == "env"  # the error names its key, env.kwargs.sucess_rate
    assert loaded == "[]"


def test_the_grid_tables_load_no_torch() -> None:
    """``ragen2-aggregate`` reads metrics files: it names the MI curves through the ``ragen2.curves`` leaf, not
    through the diagnostics that write them (whose package loads torch). In a fresh process."""
    code = "import sys, ragen2.aggregate, ragen2.grids.mi\nprint(sorted({'torch', 'ragen2.diagnostics'} & set(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]"
    assert not GRAPH["ragen2.curves"]  # a leaf
    assert (
        "ragen2.curves" in GRAPH["ragen2.grids.mi"] and "ragen2.curves" in GRAPH["ragen2.callbacks.collapse"]
    )
