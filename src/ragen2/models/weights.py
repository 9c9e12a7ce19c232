"""A training module's weights as full tensors, one at a time: what a rollout engine loads on a sync.

Under FSDP2 (``fully_shard``) every parameter is a ``DTensor`` holding this rank's shard;
``full_tensor()`` all-gathers it, a collective that every rank must call in the same order, so the
gather walks the parameters in their (rank-independent) registration order and yields one tensor at a
time: peak memory is the sharded model plus one full tensor. A plain module's tensors pass through.
A model with LoRA adapters (``model.lora``) yields the plain model's tensors, each adapted layer's
weight merged with its adapters (``ragen2.models.lora.merged_tensors``): what a rollout engine or a copy
of the base architecture loads.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from ragen2.models.lora import merged_tensors


def _full(t: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    return t.full_tensor() if isinstance(t, DTensor) else t


def full_named_tensors(model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """``(name, full tensor)`` for every parameter and persistent buffer, as the module's state_dict names them
    (LoRA adapters merged into their layers' weights, under the plain model's names).

    Tied parameters appear once (under their first name, as ``named_parameters`` lists them); loaders
    of tied checkpoints (HF's, vLLM's) skip the missing alias. Tensors are detached, not copied (but for
    merged weights).
    """
    with torch.no_grad():
        params = ((name, _full(p.detach())) for name, p in model.named_parameters())
        yield from merged_tensors(model, params)
        for module_name, module in model.named_modules():
            persistent = set(module._buffers) - module._non_persistent_buffers_set
            for leaf, b in module.named_buffers(recurse=False):
                if leaf in persistent and b is not None:
                    yield (f"{module_name}.{leaf}" if module_name else leaf), _full(b.detach())


def weights_version(model: Any) -> tuple[int, int]:
    """A value that changes whenever any parameter is updated in place (optimizer steps, loads).

    Every in-place write bumps its tensor's version counter; the sum over all parameters is cheap and
    identical across ranks (they take the same steps), so all ranks agree on whether to re-sync.
    """
    return id(model), sum(p._version for p in model.parameters())
