"""The configuration reference, docs/reference/configuration.md, written from the settings dataclasses.

Each config node that reaches its consumer as a dataclass (``algo.optim`` -> ``OptimConfig``, …) gets a
section: the node's docstring, then one row per field with the key as the command line spells it, its
type, its default and the string literal that follows the field in the class (its docstring, read with
``ast``). The page is committed, so it reads on GitHub too; tests/test_reference.py checks it is current.
Regenerate it with::

    python -m ragen2.reference > docs/reference/configuration.md
"""

from __future__ import annotations

import ast
import dataclasses
import html
import inspect
import re
import textwrap
from typing import Any

from ragen2.callbacks.diagnostics import Exact, HeldOut
from ragen2.data.demos import DemoConfig
from ragen2.data.group_filter import GroupFilter
from ragen2.data.rollout_config import EnvConfig, RolloutConfig, ValConfig
from ragen2.data.sampling import DynamicSampling
from ragen2.data.shaping import OverlongShaping
from ragen2.models.loading import ModelConfig
from ragen2.models.lora import LoRAConfig
from ragen2.models.placement import Placement
from ragen2.modules.algo_config import AlgoConfig, OptimConfig, TISConfig
from ragen2.modules.sft import SFTConfig
from ragen2.settings import shown

#: each config node that is a dataclass, by the key it is written under, in the page's order
NODES: tuple[tuple[str, type], ...] = (
    ("model", ModelConfig),
    ("model.lora", LoRAConfig),
    ("env", EnvConfig),
    ("rollout", RolloutConfig),
    ("val", ValConfig),
    ("filter", GroupFilter),
    ("algo", AlgoConfig),
    ("algo.optim", OptimConfig),
    ("algo.tis", TISConfig),
    ("algo.sampling", DynamicSampling),
    ("algo.shaping", OverlongShaping),
    ("trainer", Placement),
    ("demos", DemoConfig),
    ("sft", SFTConfig),
    ("diagnostics.heldout", HeldOut),
    ("diagnostics.exact", Exact),
)

_INTRO = """\
# Configuration reference

<!-- Written by `python -m ragen2.reference > docs/reference/configuration.md`; edit the dataclasses'
docstrings, not this page (tests/test_reference.py checks that it is current). -->

Every setting that reaches ragen2 as a field of a settings dataclass, under the key you write on the
command line (`ragen2-train algo.optim.lr=1e-5 model.lora.rank=64`). How the tree is composed, the start-up
checks and the top-level keys (`seed`, `iterations`, `max_turns_cap`, …) are in
[Configuration](../configuration.md).

- **Default** is the dataclass's own: what a node that leaves the key out gets. The files of `conf/` set
  many keys themselves (`conf/base/algo.yaml`, `conf/env/<name>.yaml`, `conf/val/default.yaml`, …):
  `ragen2-train --cfg job --package <node>` prints what a run gets. *required*: the key has no default.
- **Type** is the field's annotation; every value is checked against it at start-up.
- Nodes built from a `_target_` that is not a dataclass (`algo.advantage`, `algo.policy_loss`,
  `algo.critic`, `algo.kl_reward`, `rollout.sampler`, `diagnostics`, `callbacks.*`, `logger`, and
  `trainer` in `ragen2-train`, which is Lightning's `Trainer`) take their class's arguments: see the
  [API reference](../api/index.md) and the comments in their `conf/` files.
"""


def field_docs(cls: type) -> dict[str, str]:
    """Each field of the dataclass ``cls`` that has one -> the string literal right after it in the class
    body (its docstring)."""
    body = ast.parse(textwrap.dedent(inspect.getsource(cls))).body[0]
    assert isinstance(body, ast.ClassDef)  # getsource of a class starts with its definition
    docs = {}
    for stmt, after in zip(body.body, body.body[1:], strict=False):
        if (
            isinstance(stmt, ast.AnnAssign)
            and isinstance(stmt.target, ast.Name)
            and isinstance(after, ast.Expr)
            and isinstance(after.value, ast.Constant)
            and isinstance(after.value.value, str)
        ):
            docs[stmt.target.id] = inspect.cleandoc(after.value.value)
    return docs


def _prose(text: str) -> str:
    """Docstring text as one Markdown line."""
    return " ".join(text.split())


def _cell(text: str) -> str:
    """``text`` (Markdown) safe in a table cell on GitHub and in mkdocs alike: outside code, ``|`` is escaped
    and ``<`` is text (``<run>`` is not HTML); a code span holding a ``|`` becomes ``<code>`` with the pipe
    as an entity (the two renderers disagree on an escaped pipe inside backticks)."""
    parts = re.split(r"(``.+?``|`[^`]+`)", text)
    out = []
    for i, part in enumerate(parts):
        if not i % 2:
            out.append(part.replace("|", "\\|").replace("<", "&lt;"))
        elif "|" in part:
            code = html.escape(part.strip("`").strip(), quote=False).replace("|", "&#124;")
            out.append(f"<code>{code}</code>")
        else:
            out.append(part)
    return "".join(out)


def _summary(cls: type) -> str:
    """The first paragraph of ``cls``'s docstring, without the node it names (``algo.*``: …)."""
    first = inspect.cleandoc(cls.__doc__ or "").split("\n\n")[0]
    text = re.sub(r"^``[\w.*]+``: ", "", _prose(first))
    return text[:1].upper() + text[1:]


def _anchor(key: str) -> str:
    """The anchor of a node's heading (``algo.optim`` -> ``algooptim``), the same in mkdocs and on GitHub."""
    return re.sub(r"[^\w-]", "", key.lower())


def _default(field: dataclasses.Field[Any], nested: str | None) -> str:
    """A field's default as the command line writes it; a nested node's are in its own section."""
    if field.default is not dataclasses.MISSING:
        return f"`{shown(field.default)}`"
    if field.default_factory is not dataclasses.MISSING:
        return "its own defaults" if nested else f"`{shown(field.default_factory())}`"
    return "*required*"


def _section(key: str, cls: type, nodes: dict[str, type]) -> list[str]:
    """The Markdown of one node: heading, the class's docstring, a row per field."""
    docs = field_docs(cls)
    intro = inspect.cleandoc(cls.__doc__ or "")
    paragraphs = [_cell(_prose(p)) for p in intro.split("\n\n") if p.strip()]
    lines = [
        f"## `{key}`",
        "",
        *(p for para in paragraphs for p in (para, "")),
        f"`{cls.__module__}.{cls.__qualname__}`",
        "",
    ]
    lines += ["| Key | Type | Default | Description |", "| --- | --- | --- | --- |"]
    for field in dataclasses.fields(cls):
        name = f"{key}.{field.name}"
        if field.name not in docs:
            raise ValueError(
                f"{name} ({cls.__module__}.{cls.__qualname__}.{field.name}) has no docstring. Fix: put a "
                "string literal on the line after the field, saying what it sets"
            )
        nested = name if name in nodes else None
        kind = f"`{field.type}`" + (f", see [`{nested}`](#{_anchor(nested)})" if nested else "")
        row = (f"`{name}`", kind, _default(field, nested), _prose(docs[field.name]))
        lines.append("| " + " | ".join(_cell(c) for c in row) + " |")
    return [*lines, ""]


def render() -> str:
    """The whole page."""
    nodes = dict(NODES)
    contents = ["| Node | Settings |", "| --- | --- |"]
    contents += [f"| [`{key}`](#{_anchor(key)}) | {_cell(_summary(cls))} |" for key, cls in NODES]
    sections = [line for key, cls in NODES for line in _section(key, cls, nodes)]
    return "\n".join([_INTRO, *contents, "", *sections]).rstrip("\n") + "\n"


def main() -> None:
    print(render(), end="")


if __name__ == "__main__":
    main()
