"""trainer.strategy.timeout (conf/trainer/ddp.yaml, fsdp.yaml) reaches torch.distributed.init_process_group.

The strategies are built from the composed config and set up as Lightning sets them up, on one CPU rank
(gloo); the process group they create is asked for its timeout. tests/integration/test_pg_timeout.py runs
two ranks and shows the timeout ending a collective that one rank never joins.
"""

from __future__ import annotations

import socket
from datetime import timedelta

import lightning as L
import pytest
import torch
import torch.distributed as dist
from lightning.fabric.plugins.environments import LightningEnvironment
from lightning.pytorch.accelerators import CPUAccelerator

from ragen2.config import build, compose
from ragen2.errors import ConfigError

STRATEGIES = ["ddp", "fsdp"]


@pytest.mark.parametrize("trainer", STRATEGIES)
def test_the_default_is_thirty_minutes_and_an_override_sets_it(trainer: str) -> None:
    assert build(compose([f"trainer={trainer}"]).trainer.strategy)._timeout == timedelta(minutes=30)
    cfg = compose([f"trainer={trainer}", "trainer.strategy.timeout.seconds=90"])
    assert build(cfg.trainer.strategy)._timeout == timedelta(seconds=90)


@pytest.mark.parametrize("seconds", [0, -5, "null", "inf"])
def test_a_bad_timeout_is_refused_naming_the_key(seconds: object) -> None:
    cfg = compose(["trainer=ddp", f"trainer.strategy.timeout.seconds={seconds}"])
    with pytest.raises(ConfigError, match=r"trainer\.strategy\.timeout\.seconds=.*Fix: "):
        build(cfg.trainer.strategy)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("trainer", STRATEGIES)
def test_the_process_group_gets_the_configured_timeout(trainer: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(_free_port()))
    cfg = compose([f"trainer={trainer}", "trainer.devices=1", "trainer.strategy.timeout.seconds=7"])
    strategy = build(cfg.trainer.strategy)
    strategy.accelerator = CPUAccelerator()
    strategy.parallel_devices = [torch.device("cpu")]
    strategy.cluster_environment = LightningEnvironment()
    strategy.connect(L.LightningModule())
    assert not dist.is_initialized()
    strategy.setup_environment()  # Lightning's own call: init_process_group with the strategy's timeout
    try:
        group = dist.distributed_c10d._get_default_group()
        assert group._get_backend(torch.device("cpu")).options._timeout == timedelta(seconds=7)
    finally:
        dist.destroy_process_group()
