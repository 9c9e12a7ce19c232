"""Rollout data: the batch type, the SNR filter, DAPO's dynamic sampling and overlong shaping, rollout
metrics and the DataModule."""

from ragen2.data.batch import RolloutBatch, collate_episodes, returns_by_group
from ragen2.data.datamodule import RolloutDataModule
from ragen2.data.filtering import GroupFilter
from ragen2.data.metrics import pass_at_k, rollout_metrics
from ragen2.data.sampling import DynamicSampling
from ragen2.data.shaping import OverlongShaping

__all__ = [
    "DynamicSampling",
    "GroupFilter",
    "OverlongShaping",
    "RolloutBatch",
    "RolloutDataModule",
    "collate_episodes",
    "pass_at_k",
    "returns_by_group",
    "rollout_metrics",
]
