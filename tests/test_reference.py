"""The configuration reference (docs/reference/configuration.md): current, and listing every field of every
config dataclass under its key.

Which dataclasses are config nodes is found here without the generator's list: every ``settings(Class, …,
"<key>")`` call in src/ragen2 (how a consumer builds its node), every ``_target_`` of conf/ that is a
dataclass (``filter``, ``algo.sampling``), and, below each, every field whose type is a dataclass.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import re
import types
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import markdown
import pytest
import yaml
from hydra.utils import get_object

from ragen2 import reference

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "ragen2"
CONF = ROOT / "conf"
PAGE = ROOT / "docs" / "reference" / "configuration.md"


def _settings_calls() -> Iterator[tuple[str, type]]:
    """(key, class) of each ``settings(Class, node, "key")`` in the package's source, the class found where
    the file imports it (at its top or inside a function) or defines it."""
    for path in SRC.rglob("*.py"):
        tree = ast.parse(path.read_text())
        module = ".".join(path.relative_to(SRC.parent).with_suffix("").parts).removesuffix(".__init__")
        origin = {
            alias.asname or alias.name: node.module
            for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) and node.module
            for alias in node.names
        }
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id == "settings"
                and len(node.args) == 3
                and isinstance(node.args[0], ast.Name)
                and isinstance(node.args[2], ast.Constant)
            ):
                name = node.args[0].id
                yield node.args[2].value, getattr(importlib.import_module(origin.get(name, module)), name)


def _targets(node: Any, key: str) -> Iterator[tuple[str, str]]:
    """(key, ``_target_``) of every node under ``node`` (a loaded YAML file) that names one."""
    if isinstance(node, dict):
        if isinstance(node.get("_target_"), str):
            yield key, node["_target_"]
        for name, child in node.items():
            yield from _targets(child, f"{key}.{name}" if key else str(name))


def _conf_dataclasses() -> Iterator[tuple[str, type]]:
    """(key, class) of each ``_target_`` of ragen2's own in conf/ that is a dataclass; a file's keys sit under
    its group's folders (``algo/dapo.yaml``'s ``sampling`` is ``algo.sampling``), ``base/<node>.yaml``'s under
    ``<node>``, a ``# @package _global_`` file's at the top."""
    for path in CONF.rglob("*.yaml"):
        text = path.read_text()
        parts = path.relative_to(CONF).parent.parts
        prefix = (
            ""
            if text.startswith("# @package _global_")
            else path.stem
            if parts == ("base",)
            else ".".join(parts)
        )
        for key, target in _targets(yaml.safe_load(text), prefix):
            if target.startswith("ragen2.") and dataclasses.is_dataclass(obj := get_object(target)):
                assert isinstance(obj, type)
                yield key, obj


def _nested(key: str, cls: type) -> Iterator[tuple[str, type]]:
    """``(key, cls)`` and, recursively, each field of ``cls`` whose type is (or may be) a dataclass."""
    yield key, cls
    for name, hint in typing.get_type_hints(cls).items():
        union = typing.get_origin(hint) in (typing.Union, types.UnionType)
        for option in typing.get_args(hint) if union else (hint,):
            if isinstance(option, type) and dataclasses.is_dataclass(option):
                yield from _nested(f"{key}.{name}", option)


@pytest.fixture(scope="module")
def config_nodes() -> dict[str, type]:
    found = [*_settings_calls(), *_conf_dataclasses()]
    return {key: cls for root, top in found for key, cls in _nested(root, top)}


def test_every_field_of_every_config_dataclass_is_on_the_page(config_nodes: dict[str, type]) -> None:
    # the walk reaches the nodes of every program: training, the warm start, eval/diagnose's device
    assert {"algo", "algo.optim", "algo.tis", "algo.sampling", "algo.shaping", "model", "model.lora"} <= set(
        config_nodes
    )
    assert {"env", "rollout", "val", "filter", "sft", "demos", "trainer"} <= set(config_nodes)
    rows = set(re.findall(r"^\| `([\w.]+)` \|", PAGE.read_text(), flags=re.M))
    missing = [
        f"{key}.{f.name} ({cls.__qualname__})"
        for key, cls in config_nodes.items()
        for f in dataclasses.fields(cls)
        if f"{key}.{f.name}" not in rows
    ]
    assert not missing, (
        f"not in {PAGE.relative_to(ROOT)}: {', '.join(missing)} (add the node to ragen2.reference.NODES)"
    )


def test_committed_page_is_the_generated_one() -> None:
    assert PAGE.read_text() == reference.render(), (
        f"{PAGE.relative_to(ROOT)} is stale. Fix: python -m ragen2.reference > docs/reference/configuration.md"
    )


def test_every_table_row_has_its_four_cells() -> None:
    """A ``|`` in a type, a default or a docstring stays inside its cell (mkdocs' Markdown)."""
    page = markdown.markdown(PAGE.read_text(), extensions=["tables"])
    rows = re.findall(r"<tr>(.*?)</tr>", page, flags=re.S)
    widths = {len(re.findall(r"<t[dh]>", row)) for row in rows[len(reference.NODES) + 1 :]}
    assert len(rows) > 100
    assert widths == {4}
    assert "<code>float &#124; None</code>" in page and r"\|" not in page


@dataclasses.dataclass(frozen=True)
class _Undocumented:
    """``demo.*``: a node with a field that says nothing."""

    size: int = 1


def test_a_field_without_a_docstring_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(reference, "NODES", (*reference.NODES, ("demo", _Undocumented)))
    with pytest.raises(ValueError, match=r"^demo\.size \(.*_Undocumented\.size\) has no docstring\. Fix: "):
        reference.render()
