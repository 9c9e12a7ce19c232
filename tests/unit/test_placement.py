"""ragen2.models.placement: training's trainer.* keys for the programs that run a model without a Trainer."""

from __future__ import annotations

import pytest
import torch

from ragen2.errors import ConfigError
from ragen2.models.placement import Placement


def test_auto_takes_the_gpu_when_present() -> None:
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert Placement().device().type == expected
    assert Placement(accelerator="cpu").device() == torch.device("cpu")


def test_mixed_precision_autocasts_and_32_true_does_not() -> None:
    with Placement(accelerator="cpu", precision="bf16-mixed").autocast():
        assert torch.get_autocast_dtype("cpu") == torch.bfloat16 and torch.is_autocast_enabled("cpu")
    with Placement(accelerator="cpu").autocast():
        assert not torch.is_autocast_enabled("cpu")


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is present")
def test_a_gpu_that_is_not_there_is_refused() -> None:
    with pytest.raises(
        ConfigError, match=r"trainer.accelerator=gpu .* no CUDA device.*Fix: trainer.accelerator=cpu"
    ):
        Placement(accelerator="gpu")


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"accelerator": "tpu"}, r"trainer.accelerator='tpu'.*Fix: one of auto, cpu, gpu, cuda"),
        ({"precision": "64-true"}, r"trainer.precision='64-true'.*Fix"),
        ({"devices": 2}, r"trainer.devices=2: this program runs on one device.*Fix"),
        ({"devices": [-1]}, r"trainer.devices=\[-1\] names no device index"),
    ],
)
def test_bad_settings_name_the_key_and_the_fix(kwargs: dict, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        Placement(**{"accelerator": "cpu", **kwargs})


def test_eval_refuses_a_missing_gpu_before_any_model_loads(tmp_path) -> None:
    from ragen2.config import compose
    from ragen2.eval import run

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    cfg = compose(["model=tiny", "trainer.accelerator=gpu", f"output={tmp_path}/e.json"], config_name="eval")
    with pytest.raises(ConfigError, match="trainer.accelerator=gpu"):
        run(cfg)
