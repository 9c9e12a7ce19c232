"""``perf/*``: each phase's throughput and, on a CUDA device, its peak memory over all ranks.

A phase resets the device's peak counter when it starts and reads it when it ends, so the rollout's and
the update's peaks are reported apart (the number a researcher sizes ``gpu_memory_utilization`` and the
micro-batch by). Tokens are summed over every rank; the peak is the largest rank's.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ragen2.distributed import Ranks

GIB = 2**30


def start_phase(device: torch.device) -> None:
    """Reset the peak counter of ``device`` (a no-op off CUDA)."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


@dataclass(frozen=True)
class PhasePerf:
    """One phase of an iteration (the rollout or the update): its time (the slowest rank's), the tokens it
    processed over every rank and, on CUDA, the largest rank's peak memory."""

    seconds: float
    tokens: float
    peak_memory_gb: float | None = None

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / max(self.seconds, 1e-9)

    def as_metrics(self, phase: str) -> dict[str, float]:
        """``time/<phase>``, ``perf/<phase>_tokens``, ``perf/<phase>_tokens_per_s`` and, on CUDA,
        ``perf/<phase>_peak_memory_gb``."""
        out = {
            f"time/{phase}": self.seconds,
            f"perf/{phase}_tokens": self.tokens,
            f"perf/{phase}_tokens_per_s": self.tokens_per_s,
        }
        return out | (
            {} if self.peak_memory_gb is None else {f"perf/{phase}_peak_memory_gb": self.peak_memory_gb}
        )


def phase_perf(tokens: int, seconds: float, device: torch.device, ranks: Ranks) -> PhasePerf:
    """The phase's ``PhasePerf``: ``tokens`` summed over every rank, the peak read on CUDA (every rank calls
    this: the sums and the maximum are collectives)."""
    total = float(ranks.sum(torch.tensor([float(tokens)]))[0])
    peak = ranks.max([torch.cuda.max_memory_allocated(device)])[0] / GIB if device.type == "cuda" else None
    return PhasePerf(seconds, total, peak)
