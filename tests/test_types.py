"""The library type-checks: basedpyright (pyright's checker) in its ``standard`` mode over src/ragen2, with the
settings of ``[tool.basedpyright]`` in pyproject.toml, finds no error and no warning."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
LIBRARY = ROOT / "src" / "ragen2"
# the packages of optional extras the library imports (rollout=vllm): where one is not installed (RAGEN2_VLLM=none,
# macOS) its imports cannot resolve, which says nothing about the library's own types
OPTIONAL = ("vllm", "mlflow")
UNRESOLVED = re.compile(r'Import "(\w+)[\w.]*" could not be resolved')


def _optional_and_absent(diagnostic: dict[str, Any]) -> bool:
    unresolved = UNRESOLVED.match(diagnostic["message"])
    return (
        diagnostic.get("rule") == "reportMissingImports"
        and unresolved is not None
        and unresolved.group(1) in OPTIONAL
        and importlib.util.find_spec(unresolved.group(1)) is None
    )


@pytest.mark.slow
def test_the_library_type_checks() -> None:
    if importlib.util.find_spec("basedpyright") is None:
        pytest.skip("basedpyright is not installed: pip install -e '.[dev]'")
    # third-party packages resolve from the interpreter running the tests (its virtualenv)
    command = [sys.executable, "-m", "basedpyright", "--project", str(ROOT), "--pythonpath", sys.executable]
    done = subprocess.run([*command, "--outputjson"], capture_output=True, text=True, cwd=ROOT, timeout=500)
    # 0: clean, 1: diagnostics; anything else (a bad config, a crash) leaves no report to read
    assert done.returncode in (0, 1), f"basedpyright exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    report = json.loads(done.stdout)
    found = [
        f"{Path(d['file']).relative_to(ROOT)}:{d['range']['start']['line'] + 1}: {d['severity']}: "
        f"{d['message']} ({d.get('rule', 'no rule')})"
        for d in report["generalDiagnostics"]
        if d["severity"] in ("error", "warning") and not _optional_and_absent(d)
    ]
    if found:
        pytest.fail(f"{len(found)} type errors and warnings:\n" + "\n".join(found), pytrace=False)
    # a config that pointed the check elsewhere would pass with nothing checked
    assert report["summary"]["filesAnalyzed"] >= len(list(LIBRARY.rglob("*.py")))
