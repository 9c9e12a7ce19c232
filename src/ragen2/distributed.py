"""The few collectives one RL iteration needs across data-parallel ranks (DDP or FSDP).

Each rank rolls out its share of the iteration's groups and trains on its own kept rows, but every
decision that must be the same everywhere is made from gathered values: which groups the SNR filter
keeps, how many optimizer steps and micro-batches there are, whitening statistics, the logged numbers.
With one process every collective is the identity, so a single-process run computes bit for bit what
it computed before any of this existed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
import torch.distributed as dist

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
        return any(self.gather(bool(flag)))


def _backend_device() -> torch.device:
    """Where the default group's collectives take tensors: the rank's GPU under NCCL, else the CPU."""
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")
