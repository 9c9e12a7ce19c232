"""The documentation: the site builds under ``--strict`` with every module in its API reference, the method
spec is cited by sections it has, the README's links resolve, and the license and hooks are declared."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml
from markdown.extensions.toc import slugify

ROOT = Path(__file__).resolve().parents[1]
METHOD = ROOT / "docs" / "method.md"
# where the method spec is cited: source, configs (conf/), tests, benchmarks, notebooks and every doc
CITING = ("src", "conf", "envs", "tests", "bench", "notebooks", "docs", "scripts", "slurm")
CITING_SUFFIXES = {".py", ".md", ".yaml", ".yml", ".ipynb", ".sh", ".toml"}


def _citing_files() -> list[Path]:
    files = [ROOT / "README.md", ROOT / "results" / "README.md"]
    for folder in CITING:
        files += [p for p in (ROOT / folder).rglob("*") if p.suffix in CITING_SUFFIXES and p.is_file()]
    # this file names the old citation to refuse it
    return [p for p in files if "__pycache__" not in p.parts and p != Path(__file__).resolve()]


def _method_sections() -> dict[int, str]:
    """Section number -> that section's text, from the ``## N. Title`` headings of docs/method.md."""
    parts = re.split(r"^## (\d+)\. ", METHOD.read_text(), flags=re.M)
    return {int(number): text for number, text in zip(parts[1::2], parts[2::2], strict=True)}


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site, built once by ``mkdocs build --strict`` from outside the repository; fails on any warning."""
    out = tmp_path_factory.mktemp("docs")
    config, site_dir = str(ROOT / "mkdocs.yml"), str(out / "site")
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "mkdocs",
            "build",
            "--strict",
            "--config-file",
            config,
            "--site-dir",
            site_dir,
        ],
        cwd=out,  # paths in mkdocs.yml and its hooks must not depend on the working directory
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    log = result.stdout + result.stderr
    assert result.returncode == 0, log
    assert "WARNING" not in log, log
    return out / "site"


def test_site_builds_with_every_page(site: Path) -> None:
    nav_pages = re.findall(r":\s*([\w/.-]+\.md)\s*$", (ROOT / "mkdocs.yml").read_text(), flags=re.M)
    assert len(nav_pages) > 20
    for page in nav_pages:
        built = site / page.removesuffix(".md") / "index.html" if page != "index.md" else site / "index.html"
        assert built.is_file(), f"{page} was not built"
    method = (site / "method" / "index.html").read_text()
    assert method.count('class="arithmatex"') > 20  # formulas are marked for MathJax, not left as text
    # the folder READMEs are pages; their links into the repository became repository paths
    results = (site / "results" / "index.html").read_text()
    assert "results/frozenlake_filter_cpu/" in results and 'href="frozenlake_filter_cpu/' not in results


def test_api_reference_documents_every_public_module(site: Path) -> None:
    api = "".join(p.read_text() for p in (site / "api").rglob("index.html"))
    anchors = set(re.findall(r'id="((?:ragen2|ragen2_envs)(?:\.\w+)*)"', api))
    modules = [
        ".".join(p.relative_to(base).with_suffix("").parts)
        for base in (ROOT / "src", ROOT / "envs")
        for p in base.rglob("*.py")
        if not any(part.startswith("_") for part in p.relative_to(base).parts[1:])
    ]
    assert len(modules) > 80
    assert not [m for m in modules if m not in anchors], "modules missing from the API reference"
    # members are rendered, not just module headings (one function, one class, one method)
    assert {"ragen2.algos.advantages.grpo", "ragen2.data.group_filter.GroupFilter"} <= anchors
    assert "ragen2_envs.base.TextEnv.oracle_action" in anchors


def test_method_citations_name_sections_that_exist() -> None:
    sections = _method_sections()
    assert sorted(sections) == list(range(1, 10))
    cited: list[tuple[Path, int, str]] = []
    for path in _citing_files():
        text = path.read_text(errors="replace")
        assert "METHOD.md" not in text, f"{path.relative_to(ROOT)} cites METHOD.md: cite docs/method.md §N"
        for number, quoted in re.findall(r'docs/method\.md §(\d+)(?: \\?"([^"\\]+)\\?")?', text):
            cited.append((path, int(number), quoted))
    assert len(cited) > 30
    for path, number, quoted in cited:
        assert number in sections, (
            f"{path.relative_to(ROOT)} cites docs/method.md §{number}, which does not exist"
        )
        # a quoted part ("Cost") names a paragraph of that section
        assert quoted in sections[number], f"{path.relative_to(ROOT)}: §{number} has no {quoted!r}"


def test_readme_links_resolve() -> None:
    readme = (ROOT / "README.md").read_text()
    links = [t for t in re.findall(r"\]\(([^)\s]+)\)", readme) if not t.startswith(("http://", "https://"))]
    assert len(links) > 10
    for link in links:
        path, _, anchor = link.partition("#")
        target = ROOT / path
        assert target.exists(), f"README.md links to {link}, which does not exist"
        if anchor:
            headings = re.findall(r"^#+ (.+)$", target.read_text(), flags=re.M)
            assert anchor in {slugify(h, "-") for h in headings}, f"README.md: no heading for #{anchor}"
    # a front page: the rest lives in docs/
    assert len(readme.splitlines()) < 120


def test_license_is_declared() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert project["project"]["license"] == "Apache-2.0"
    assert project["project"]["license-files"] == ["LICENSE"]
    # a license expression needs setuptools >= 77 to build
    assert "setuptools>=77" in project["build-system"]["requires"]
    text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text


def test_pre_commit_hooks_are_pinned() -> None:
    config = yaml.safe_load((ROOT / ".pre-commit-config.yaml").read_text())
    hooks = {hook["id"] for repo in config["repos"] for hook in repo["hooks"]}
    assert {"ruff-check", "ruff-format", "codespell", "nbstripout"} <= hooks
    for repo in config["repos"]:
        assert re.fullmatch(r"v?\d+(\.\d+)+", repo["rev"]), (
            f"{repo['repo']} is not pinned: rev {repo['rev']!r}"
        )
