"""The few collectives one RL iteration needs across data-parallel ranks (DDP or FSDP).

Each rank rolls out its share of the iteration's groups and trains on its own kept rows, but every
decision that must be the same everywhere is made from gathered values: which groups the SNR filter
keeps, how many optimizer steps and micro-batches there are, whitening statistics, the logged numbers.
With one process every collective is the identity, so a single-process run computes bit for bit what
it computed before any of this existed.

``process_group_timeout`` builds the strategies' ``timeout`` (conf/trainer/ddp.yaml, fsdp.yaml): how long
a collective waits for the other ranks before it fails, so a rank stuck for good ends the job.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar

import torch
import torch.distributed as dist

from ragen2.errors import ConfigError

T = TypeVar("T")


@dataclass(frozen=True)
class Ranks:
    """This process's place among the data-parallel ranks, and the collectives it joins."""

    rank: int = 0
    world: int = 1

    @classmethod
    def current(cls) -> Ranks:
        """The default process group's ranks (Lightning's DDP/FSDP strategies create it), or one process."""
        if dist.is_available() and dist.is_initialized():
            return cls(dist.get_rank(), dist.get_world_size())
        return cls()

    def gather(self, obj: T) -> list[T]:
        """Every rank's ``obj`` (any picklable value), in rank order."""
        if self.world == 1:
            return [obj]
        out: list[Any] = [None] * self.world
        dist.all_gather_object(out, obj)
        return out

    def concat(self, x: torch.Tensor) -> torch.Tensor:
        """Every rank's 1-D ``x`` (lengths may differ), concatenated in rank order."""
        if self.world == 1:
            return x
        return torch.cat([torch.as_tensor(part, dtype=x.dtype) for part in self.gather(x.cpu())]).to(x.device)

    def offset(self, count: int) -> tuple[int, int]:
        """(first global index of this rank's ``count`` items, the global total), items in rank order."""
        counts = self.gather(int(count))
        return sum(counts[: self.rank]), sum(counts)

    def sum(self, x: torch.Tensor) -> torch.Tensor:
        """The element-wise sum of ``x`` over ranks (a new tensor; ``x`` itself when there is one rank)."""
        if self.world == 1:
            return x
        out = x.to(_backend_device(), copy=True)  # NCCL reduces CUDA tensors only
        dist.all_reduce(out)
        return out.to(x.device)

    def max(self, values: Sequence[int]) -> list[int]:
        """The element-wise maximum of a list of ints over ranks (lists of the same length)."""
        if self.world == 1:
            return list(values)
        return [max(column) for column in zip(*self.gather(list(values)))]

    def sum_floats(self, values: Mapping[str, float]) -> dict[str, float]:
        """Per key, the sum over ranks of ``values`` (a key missing on a rank counts 0 there)."""
        if self.world == 1:
            return dict(values)
        out: dict[str, float] = {}
        for part in self.gather(dict(values)):
            for k, v in part.items():
                out[k] = out.get(k, 0.0) + v
        return out

    def any(self, flag: bool) -> bool:
        """Whether ``flag`` holds on some rank (one all-reduce)."""
        return bool(self.sum(torch.tensor([int(flag)]))[0])

    def all(self, flag: bool) -> bool:
        """Whether ``flag`` holds on every rank (one all-reduce)."""
        return not self.any(not flag)


ONE_PROCESS = Ranks()  # the default of functions that also run outside a process group


def _backend_device() -> torch.device:
    """Where the default group's collectives take tensors: the rank's GPU under NCCL, else the CPU."""
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def process_group_timeout(seconds: float) -> timedelta:
    """``trainer.strategy.timeout``: the process group's limit on any one wait for the other ranks.

    Lightning hands it to ``torch.distributed.init_process_group``; a collective still waiting after it
    raises (gloo) or aborts the process (NCCL), so a rank that hangs ends the job instead of spending its
    allocation. It must exceed the longest lead one rank can legitimately take: a rollout that is slow on
    one rank only, rank 0's consolidated checkpoint, a validation pass.
    """
    if (
        isinstance(seconds, bool)
        or not isinstance(seconds, int | float)
        or not math.isfinite(seconds)
        or seconds <= 0
    ):
        raise ConfigError(
            f"trainer.strategy.timeout.seconds={seconds!r} must be a positive number of seconds. "
            "Fix: trainer.strategy.timeout.seconds=1800 (30 min)"
        )
    return timedelta(seconds=seconds)
