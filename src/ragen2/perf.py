"""``perf/*``: each phase's throughput and, on a CUDA device, its peak memory over all ranks.

A phase resets the device's peak counter when it starts and reads it when it ends, so the rollout's and
the update's peaks are reported apart (the number a researcher sizes ``gpu_memory_utilization`` and the
micro-batch by). Tokens are summed over every rank; the peak is the largest rank's.
"""

from __future__ import annotations

import torch

from ragen2.distributed import Ranks

GIB = 2**30


def start_phase(device: torch.device) -> None:
    """Reset the peak counter of ``device`` (a no-op off CUDA)."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def phase_metrics(
    phase: str, tokens: int, seconds: float, device: torch.device, ranks: Ranks
) -> dict[str, float]:
    """``perf/<phase>_tokens``, ``perf/<phase>_tokens_per_s`` and, on CUDA, ``perf/<phase>_peak_memory_gb``."""
    total = float(ranks.sum(torch.tensor([float(tokens)]))[0])
    metrics = {f"perf/{phase}_tokens": total, f"perf/{phase}_tokens_per_s": total / max(seconds, 1e-9)}
    if device.type == "cuda":
        peak = ranks.max([torch.cuda.max_memory_allocated(device)])[0]
        metrics[f"perf/{phase}_peak_memory_gb"] = peak / GIB
    return metrics
