"""Rollout data: the batch type, the env/rollout/val configs, the SNR filter, DAPO's dynamic sampling and
overlong shaping, the seeds, one iteration's rollouts (``collect_iteration``, plain torch), the typed records of what rollouts did,
held-out evaluation and the DataModule; the warm start's demonstrations and their DataModule.

Each name loads its module on first use: importing any ``ragen2.data.<module>`` runs this file first, and a
config check that needs only ``EnvConfig`` must not wait seconds for Lightning (``RolloutDataModule``).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ragen2.data.batch import RolloutBatch, by_group, collate_episodes
    from ragen2.data.datamodule import RolloutDataModule
    from ragen2.data.demo_datamodule import DemoBatch, DemoDataModule
    from ragen2.data.demos import DemoConfig, demonstrate
    from ragen2.data.evaluation import evaluate, heldout_seeds, pass_at_k
    from ragen2.data.group_filter import Filter, GroupFilter, select_across
    from ragen2.data.iteration import IterationPlan, collect_iteration
    from ragen2.data.record import GroupStats, RolloutStats
    from ragen2.data.rollout_config import EnvConfig, RolloutConfig, ValConfig
    from ragen2.data.sampling import DynamicSampling
    from ragen2.data.shaping import OverlongShaping

#: each public name's module under ragen2.data
_MODULE = {
    "RolloutBatch": "batch",
    "by_group": "batch",
    "collate_episodes": "batch",
    "RolloutDataModule": "datamodule",
    "DemoBatch": "demo_datamodule",
    "DemoDataModule": "demo_datamodule",
    "DemoConfig": "demos",
    "demonstrate": "demos",
    "evaluate": "evaluation",
    "heldout_seeds": "evaluation",
    "pass_at_k": "evaluation",
    "Filter": "group_filter",
    "GroupFilter": "group_filter",
    "select_across": "group_filter",
    "IterationPlan": "iteration",
    "collect_iteration": "iteration",
    "GroupStats": "record",
    "RolloutStats": "record",
    "EnvConfig": "rollout_config",
    "RolloutConfig": "rollout_config",
    "ValConfig": "rollout_config",
    "DynamicSampling": "sampling",
    "OverlongShaping": "shaping",
}

__all__ = [
    "DemoBatch",
    "DemoConfig",
    "DemoDataModule",
    "DynamicSampling",
    "EnvConfig",
    "Filter",
    "GroupFilter",
    "GroupStats",
    "IterationPlan",
    "OverlongShaping",
    "RolloutBatch",
    "RolloutConfig",
    "RolloutDataModule",
    "RolloutStats",
    "ValConfig",
    "by_group",
    "collate_episodes",
    "collect_iteration",
    "demonstrate",
    "evaluate",
    "heldout_seeds",
    "pass_at_k",
    "select_across",
]


def __getattr__(name: str) -> Any:
    """A public name, imported from its module the first time it is read (PEP 562)."""
    if name not in _MODULE:
        raise AttributeError(f"module 'ragen2.data' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"ragen2.data.{_MODULE[name]}"), name)
    globals()[name] = value  # later reads skip this function
    return value
