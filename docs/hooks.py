"""MkDocs build hooks: pages the site builds from the repository itself, so each fact has one source.

- The folder READMEs (``INCLUDED``) are read where they live, next to the files they document. Their
  relative links point into the repository, not into the site: a link to a page of ``docs/`` or to another
  included README becomes a link to its page, any other becomes the repository path as code, so the strict
  build has no dead links.
- The API reference (``API``) has one page per package, listing every public module found on disk (a
  file not starting with ``_``), so a new module is documented without editing the docs; mkdocstrings
  renders each from its docstrings, through the griffe extension in ``docs/griffe_docstrings.py`` (given
  to mkdocstrings here by absolute path: griffe resolves a relative one against the working directory).
"""

from __future__ import annotations

import posixpath
import re
from pathlib import Path

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.plugins import event_priority
from mkdocs.structure.files import File, Files
from mkdocs.structure.pages import Page

#: site page -> the repository file it is built from
INCLUDED: dict[str, str] = {
    "environments.md": "envs/README.md",
    "slurm.md": "slurm/README.md",
    "results.md": "results/README.md",
    "notebooks.md": "notebooks/README.md",
}
#: API page -> (package, its folder in the repository, whether subpackages get sections on the same page)
API: dict[str, tuple[str, str, bool]] = {
    "api/ragen2.md": ("ragen2", "src/ragen2", False),
    "api/agent.md": ("ragen2.agent", "src/ragen2/agent", False),
    "api/algos.md": ("ragen2.algos", "src/ragen2/algos", False),
    "api/callbacks.md": ("ragen2.callbacks", "src/ragen2/callbacks", False),
    "api/data.md": ("ragen2.data", "src/ragen2/data", False),
    "api/diagnostics.md": ("ragen2.diagnostics", "src/ragen2/diagnostics", False),
    "api/grids.md": ("ragen2.grids", "src/ragen2/grids", False),
    "api/integrations.md": ("ragen2.integrations", "src/ragen2/integrations", False),
    "api/lifecycle.md": ("ragen2.lifecycle", "src/ragen2/lifecycle", False),
    "api/models.md": ("ragen2.models", "src/ragen2/models", False),
    "api/modules.md": ("ragen2.modules", "src/ragen2/modules", False),
    "api/rollout.md": ("ragen2.rollout", "src/ragen2/rollout", False),
    "api/envs.md": ("ragen2_envs", "envs/ragen2_envs", True),
}
LINK = re.compile(r"\[(?P<text>[^\]]+)\]\((?P<target>[^)\s]+)\)")
EXTERNAL = ("http://", "https://", "mailto:", "#")


def _root(config: MkDocsConfig) -> Path:
    return Path(config.config_file_path).parent


@event_priority(100)  # before mkdocstrings reads its handlers' options
def on_config(config: MkDocsConfig) -> MkDocsConfig:
    python = config.plugins["mkdocstrings"].config["handlers"]["python"]
    python.setdefault("options", {})["extensions"] = [str(_root(config) / "docs" / "griffe_docstrings.py")]
    return config


def public_modules(folder: Path) -> list[str]:
    """The module names of ``folder``'s public ``.py`` files, sorted."""
    return sorted(p.stem for p in folder.glob("*.py") if not p.name.startswith("_"))


def subpackages(folder: Path) -> list[str]:
    """The names of ``folder``'s public subpackages (folders with an ``__init__.py``), sorted."""
    return sorted(
        p.name for p in folder.iterdir() if (p / "__init__.py").is_file() and not p.name.startswith("_")
    )


def _directive(name: str, level: int, members: bool) -> str:
    options = f"      heading_level: {level}\n" + ("" if members else "      members: false\n")
    return f"::: {name}\n    options:\n{options}"


def api_page(package: str, folder: Path, with_subpackages: bool) -> str:
    """The markdown of one package's API page: its docstring, then each module (and subpackage) in turn."""
    parts = [f"# `{package}`\n", _directive(package, 2, members=False)]
    parts += [_directive(f"{package}.{m}", 2, members=True) for m in public_modules(folder)]
    if with_subpackages:
        for sub in subpackages(folder):
            parts.append(_directive(f"{package}.{sub}", 2, members=False))
            parts += [
                _directive(f"{package}.{sub}.{m}", 3, members=True) for m in public_modules(folder / sub)
            ]
    return "\n".join(parts)


def on_files(files: Files, config: MkDocsConfig) -> Files:
    root = _root(config)
    for page, source in INCLUDED.items():
        if not (root / source).is_file():
            raise FileNotFoundError(
                f"docs/hooks.py INCLUDED[{page!r}] = {source!r} does not exist: fix the path"
            )
        files.append(File.generated(config, page, abs_src_path=str(root / source)))
    for page, (package, folder, with_subpackages) in API.items():
        if not (root / folder / "__init__.py").is_file():
            raise FileNotFoundError(
                f"docs/hooks.py API[{page!r}]: {folder}/__init__.py does not exist: fix the path"
            )
        files.append(File.generated(config, page, content=api_page(package, root / folder, with_subpackages)))
    return files


def on_page_markdown(markdown: str, page: Page, config: MkDocsConfig, files: Files) -> str:
    source = INCLUDED.get(page.file.src_uri)
    if source is None:
        return markdown
    pages = {repo_path: site_page for site_page, repo_path in INCLUDED.items()}
    folder = posixpath.dirname(source)

    def relink(match: re.Match[str]) -> str:
        target = match["target"]
        if target.startswith(EXTERNAL):
            return match[0]
        path, _, anchor = target.partition("#")
        repo_path = posixpath.normpath(posixpath.join(folder, path))
        if repo_path in pages or repo_path.startswith("docs/"):
            page = pages.get(repo_path, repo_path.removeprefix("docs/"))
            return f"[{match['text']}]({page}{'#' + anchor if anchor else ''})"
        return f"`{repo_path}{'/' if path.endswith('/') else ''}`"

    return LINK.sub(relink, markdown)
