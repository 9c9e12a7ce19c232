"""Two real ranks (gloo): rank 1 never reaches a collective in time, rank 0 fails after
trainer.strategy.timeout instead of waiting for it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import rendezvous

TESTS = Path(__file__).resolve().parents[1]
TIMEOUT_S, LATE_S = 2, 12

# One rank: the DDP strategy from the composed config, set up as Lightning sets it up; rank 1 arrives at
# the barrier LATE_S after rank 0, which reports how long it waited and why it stopped.
RANK = """
import sys, time
import lightning as L
import torch
import torch.distributed as dist
from lightning.fabric.plugins.environments import LightningEnvironment
from lightning.pytorch.accelerators import CPUAccelerator
from ragen2.config import build, compose

timeout_s, late_s = sys.argv[1:]
strategy = build(compose(["trainer=ddp", f"trainer.strategy.timeout.seconds={timeout_s}"]).trainer.strategy)
strategy.accelerator = CPUAccelerator()
strategy.parallel_devices = [torch.device("cpu")] * 2
strategy.cluster_environment = LightningEnvironment()
strategy.connect(L.LightningModule())
strategy.setup_environment()
if dist.get_rank() == 1:
    time.sleep(float(late_s))
start = time.monotonic()
try:
    dist.barrier()
    print(f"rank {dist.get_rank()} joined after {time.monotonic() - start:.2f} s", flush=True)
except RuntimeError as err:
    print(f"rank {dist.get_rank()} failed after {time.monotonic() - start:.2f} s: {err}", flush=True)
"""


@pytest.mark.slow  # two processes that import Lightning on 2 cores
@pytest.mark.timeout(300)
def test_a_rank_that_never_arrives_ends_the_others_wait() -> None:
    with rendezvous() as meet:
        env = {**os.environ, **meet, "NODE_RANK": "0"}
        env["PYTHONPATH"] = os.pathsep.join([str(TESTS), env.get("PYTHONPATH", "")])
        ranks = [
            subprocess.Popen(
                [sys.executable, "-c", RANK, str(TIMEOUT_S), str(LATE_S)],
                env={**env, "LOCAL_RANK": str(rank), "OMP_NUM_THREADS": "1"},
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for rank in range(2)
        ]
        outputs = [ranks[0].communicate(timeout=240)]
        ranks[1].kill()  # its answer is not the test's: no need to sit out the rest of its LATE_S
        outputs.append(ranks[1].communicate(timeout=60))
    rank0 = outputs[0][0].strip().splitlines()
    assert rank0, outputs[0][1][-3000:]
    words = rank0[-1].split()
    # rank 0 gave up after the configured 2 s (not Lightning's default 30 min, nor the LATE_S rank 1 took)
    assert words[:3] == ["rank", "0", "failed"], rank0[-1]
    assert TIMEOUT_S - 0.1 <= float(words[4]) < LATE_S - 4, rank0[-1]
    assert "Timed out" in rank0[-1]
