"""Where a model runs outside a Trainer (``ragen2-eval``, ``ragen2-diagnose``): the ``trainer.*`` keys
training uses (accelerator, devices, precision), read the way Lightning reads them for one device.

``accelerator=auto`` takes the GPU when one is present, else the CPU. ``gpu``/``cuda`` on a machine with no
CUDA device, or a device index that is not there, is a ``ConfigError`` before anything loads. A mixed
precision (``bf16-mixed``, ``16-mixed``) keeps the weights in their dtype and runs sampling and scoring under
autocast, the numerics the update's forwards have in training.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any

import torch

from ragen2.errors import ConfigError

#: trainer.precision -> the autocast dtype forwards run under (none: the weights' own dtype)
AUTOCAST: dict[str, torch.dtype] = {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}
_PRECISIONS = ("32-true", "32", "bf16-mixed", "16-mixed")
_ACCELERATORS = ("auto", "cpu", "gpu", "cuda")


def autocast(device: torch.device, precision: str) -> AbstractContextManager:
    """The forwards' autocast on ``device`` under a mixed ``precision`` (``bf16-mixed``: bf16), nothing
    otherwise: sampling and scoring then compute with the numerics of the update's forwards."""
    dtype = AUTOCAST.get(str(precision))
    return torch.autocast(device.type, dtype=dtype) if dtype is not None else nullcontext()


@dataclass(frozen=True)
class Placement:
    """``trainer.*`` of ``ragen2-eval`` and ``ragen2-diagnose``: one device, as training names it."""

    accelerator: str = "auto"
    """auto (the GPU when one is present) | cpu | gpu (= cuda)."""
    devices: Any = 1
    """A count (only 1: these programs run one process) or a one-element list of the GPU index, e.g. [1]."""
    precision: str = "32-true"
    """32-true | bf16-mixed | 16-mixed: mixed runs under autocast with the weights' own dtype."""

    def __post_init__(self) -> None:
        if self.accelerator not in _ACCELERATORS:
            raise ConfigError(
                f"trainer.accelerator={self.accelerator!r} is not an accelerator here. Fix: one of "
                f"{', '.join(_ACCELERATORS)}"
            )
        if str(self.precision) not in _PRECISIONS:
            raise ConfigError(
                f"trainer.precision={self.precision!r} is not supported outside training. Fix: one of "
                f"{', '.join(_PRECISIONS)}"
            )
        self.device()  # a device that is not there fails here, at start-up

    def _index(self) -> int:
        devices = self.devices
        if isinstance(devices, list | tuple) and len(devices) == 1:
            index = devices[0]
        elif devices in (1, "1", "auto"):
            index = 0
        else:
            raise ConfigError(
                f"trainer.devices={devices!r}: this program runs on one device. Fix: trainer.devices=1, or "
                "trainer.devices=[<gpu index>]"
            )
        if isinstance(index, bool) or not isinstance(index, int) or index < 0:
            raise ConfigError(f"trainer.devices={devices!r} names no device index. Fix: trainer.devices=[0]")
        return index

    def device(self) -> torch.device:
        index = self._index()
        cuda = torch.cuda.is_available()
        if self.accelerator == "cpu" or (self.accelerator == "auto" and not cuda):
            return torch.device("cpu")
        if not cuda:
            raise no_cuda(self.accelerator)
        if index >= torch.cuda.device_count():
            raise ConfigError(
                f"trainer.devices={self.devices!r}: GPU {index} is not here ({torch.cuda.device_count()} "
                "visible). Fix: trainer.devices=[0]"
            )
        return torch.device("cuda", index)

    def autocast(self) -> AbstractContextManager:
        """The forwards' autocast under a mixed precision, nothing otherwise."""
        return autocast(self.device(), self.precision)


def no_cuda(accelerator: str) -> ConfigError:
    """The error for ``trainer.accelerator=<a GPU>`` on a machine without one."""
    return ConfigError(
        f"trainer.accelerator={accelerator} but this machine has no CUDA device "
        "(torch.cuda.is_available() is False). Fix: trainer.accelerator=cpu (or auto)"
    )
