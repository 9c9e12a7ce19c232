"""The environments that adapt another package's (each an optional extra), and what their tests share.

Their ids are not ragen2's own (``ragen2_envs.own_ids``): their conf names them ``<module>:<id>`` as an outside package's
would, so ragen2 runs without their packages. Each adapter's own test file runs the shared contract
(tests/envs/test_all_envs.py) on it and trains one iteration through it; without its package those tests skip
and say what to install, and the tests that take every conf/env/*.yaml leave these confs to them.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from integration.conftest import FAST

from ragen2.config import CONF_DIR, compose


@dataclass(frozen=True)
class Adapted:
    conf: str  # its conf/env/<conf>.yaml
    env_id: str  # the id that conf names
    module: str  # the package it wraps
    install: str  # how a developer gets it (scripts/install.sh does)

    @property
    def path(self) -> Path:
        return CONF_DIR / "env" / f"{self.conf}.yaml"

    def needed(self) -> pytest.MarkDecorator:
        """Skip unless the package imports, naming the install."""
        return pytest.mark.skipif(
            importlib.util.find_spec(self.module) is None,
            reason=f"the {self.module} package is not installed: {self.install}",
        )


ADAPTED: dict[str, Adapted] = {
    a.conf: a
    for a in (
        Adapted(
            "reasoning_gym",
            "ragen2_envs.reasoning_gym:ragen2/ReasoningGym-v0",
            "reasoning_gym",
            "pip install 'ragen2[reasoning-gym]'",
        ),
        Adapted("gem", "ragen2_envs.gem:ragen2/GEM-v0", "gem", "pip install --no-deps gem-llm==0.1.0"),
        Adapted(
            "openenv",
            "ragen2_envs.openenv:ragen2/OpenEnv-v0",
            "openenv",
            "pip install --no-deps openenv-core==0.3.0 && pip install fastmcp==4.2.3",
        ),
        Adapted(
            "verifiers",
            "ragen2_envs.verifiers:ragen2/Verifiers-v0",
            "verifiers",
            "pip install prime-sandboxes==0.5.1 math-verify==0.9.0 tomli-w==1.2.0 && pip install --no-deps "
            "verifiers==0.4.0 prime-pydantic-config==0.4.3 renderers==0.1.12",
        ),
    )
}

#: one real training iteration, cheaply: the tiny model, scripted replies (the env's oracle among them), the
#: MI pass on that iteration (tests/integration's FAST)
TRAIN = (*FAST, "iterations=1", "rollout.groups=2", "rollout.group_size=3", "algo.mini_batch_size=6")


def train_one_iteration(conf: str, run_dir: Path, *overrides: str) -> dict[str, Any]:
    """The metrics of one real training iteration on ``env=<conf>``."""
    from ragen2.train import run

    return run(compose([*TRAIN, f"env={conf}", *overrides], run_dir=str(run_dir)))


class _Hidden(importlib.abc.MetaPathFinder):
    """Imports of ``modules`` fail as if they were not installed."""

    def __init__(self, modules: set[str]) -> None:
        self.modules = modules

    def find_spec(self, name: str, path: object = None, target: object = None) -> None:
        if name.split(".")[0] in self.modules:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)


def hide(monkeypatch: pytest.MonkeyPatch, adapted: Adapted) -> None:
    """For one test, the adapted package imports as if it were not installed, and the adapter's env module is
    imported afresh (it imports the package when it loads)."""
    env_module = adapted.env_id.partition(":")[0] + ".env"
    for name in [m for m in sys.modules if m.split(".")[0] == adapted.module or m == env_module]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setattr(sys, "meta_path", [_Hidden({adapted.module}), *sys.meta_path])
