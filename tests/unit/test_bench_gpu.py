"""bench/bench_gpu.py keeps the lines of a run's output that warn: a decode step that fell back from its CUDA
graph to eager decoding is visible in the record, not only in a worker's discarded output."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from bench_gpu import warnings_in

FALLBACK = (
    "/x/ragen2/rollout/hf.py:420: UserWarning: HFSampler could not record the decode step as a CUDA graph "
    "(operation not permitted when stream is capturing); decoding eagerly."
)


def test_warning_lines_are_kept_once_in_order_and_at_most_n() -> None:
    output = "\n".join(["[ragen2] iteration 0: success 0.31", FALLBACK, "  warnings.warn(", FALLBACK, "done"])
    assert warnings_in(output) == [FALLBACK]  # the echoed source line is not a warning
    many = "\n".join(f"UserWarning: number {i}" for i in range(30))
    assert warnings_in(many, most=3) == [f"UserWarning: number {i}" for i in range(3)]
    assert warnings_in("[ragen2] iteration 0: success 0.31\nrun folder: /tmp/x") == []
