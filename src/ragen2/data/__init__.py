"""Rollout data: the batch type, the env/rollout/val configs, the SNR filter, DAPO's dynamic sampling and
overlong shaping, the seeds, one iteration's rollouts (``collect_iteration``, plain torch), rollout metrics,
held-out evaluation and the DataModule; the warm start's demonstrations and their DataModule."""

from ragen2.data.batch import RolloutBatch, by_group, collate_episodes
from ragen2.data.datamodule import RolloutDataModule
from ragen2.data.demo_datamodule import DemoBatch, DemoDataModule
from ragen2.data.demos import DemoConfig, demonstrate
from ragen2.data.evaluation import evaluate, heldout_seeds, pass_at_k
from ragen2.data.group_filter import GroupFilter
from ragen2.data.iteration import IterationPlan, collect_iteration
from ragen2.data.metrics import group_metrics, rollout_metrics
from ragen2.data.rollout_config import EnvConfig, RolloutConfig, ValConfig
from ragen2.data.sampling import DynamicSampling
from ragen2.data.shaping import OverlongShaping

__all__ = [
    "DemoBatch",
    "DemoConfig",
    "DemoDataModule",
    "DynamicSampling",
    "EnvConfig",
    "GroupFilter",
    "IterationPlan",
    "OverlongShaping",
    "RolloutBatch",
    "RolloutConfig",
    "RolloutDataModule",
    "ValConfig",
    "by_group",
    "collate_episodes",
    "collect_iteration",
    "demonstrate",
    "evaluate",
    "group_metrics",
    "heldout_seeds",
    "pass_at_k",
    "rollout_metrics",
]
