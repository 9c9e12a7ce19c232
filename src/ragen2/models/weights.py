"""A training module's weights as full tensors, one at a time: what a rollout engine loads on a sync.

Under FSDP2 (``fully_shard``) every parameter is a ``DTensor`` holding this rank's shard;
``full_tensor()`` all-gathers it, a collective that every rank must call in the same order, so the
gather walks the parameters in their (rank-independent) registration order and yields one tensor at a
time: peak memory is the sharded model plus one full tensor. A plain module's tensors pass through.
A model with LoRA adapters (``model.lora``) yields the plain model's tensors, each adapted layer's
weight merged with its adapters (``ragen2.models.lora.merged_tensors``): what a rollout engine or a copy
of the base architecture loads.

``SamplingCopy`` is such a copy: under FSDP the sampler samples from a full, unsharded copy of the policy,
refreshed from every rank's shards whenever the weights changed.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from ragen2.models.lora import has_adapters, merged_tensors


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


def _sharded(model: Any) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def _tied_names(model: Any) -> set[str]:
    """State-dict names that alias another parameter (an LM head tied to the embeddings)."""
    seen: dict[int, str] = {}
    tied = set()
    for name, p in model.named_parameters(remove_duplicate=False):
        if id(p) in seen:
            tied.add(name)
        seen.setdefault(id(p), name)
    return tied


class SamplingCopy:
    """The model a sampler samples from: the policy itself, or a full copy of an FSDP-sharded one (with
    ``merge_adapters``, also of a policy with LoRA adapters: the plain model with them merged).

    HF generate stops early on some ranks and would desynchronise a sharded model's per-forward gathers;
    the copy samples without any collective. Refreshing it is a collective (every rank rolls out, so
    every rank calls it), done only when ``weights_version`` changed. A merged copy decodes without the
    adapters' extra kernels (two small matmuls, a scale and an add per adapted layer and token).
    """

    def __init__(self, merge_adapters: bool = False) -> None:
        self.model: Any = None
        self.merge_adapters = merge_adapters
        self._synced: tuple[int, int] | None = None

    def __call__(self, policy: Any, dtype: torch.dtype | None = None) -> Any:
        """``policy``, or its copy with the current weights, in ``dtype`` (the mixed precision's compute
        dtype; None: the policy's)."""
        if not (_sharded(policy) or (self.merge_adapters and has_adapters(policy))):
            return policy
        if self.model is None:
            from transformers import AutoModelForCausalLM

            # on this rank's compute device (its shards'), not the CPU from_config defaults to; in the
            # dtype the sharded policy computes in (bf16 under bf16-*: FSDP's param_dtype), which also
            # keeps the copy at half the size of fp32 weights beside the update's optimizer state
            with torch.device(next(policy.parameters()).device):
                full = AutoModelForCausalLM.from_config(policy.config, dtype=dtype or policy.dtype)
            self.model = full.eval()
        if self._synced != weights_version(policy):
            # written tensor by tensor as they stream in: a dict of them all would hold a second full copy
            # in the policy's dtype (12 GB more for a 3B fp32 base) at the refresh's peak
            target = self.model.state_dict()  # the copy's own tensors (ties kept: one tensor, two names)
            written = set()
            for name, tensor in full_named_tensors(policy):
                if name in target:
                    target[name].copy_(tensor)
                    written.add(name)
            untied = sorted(set(target) - written - _tied_names(self.model))
            assert not untied, f"the sampling copy lacks {untied}"
            self._synced = weights_version(policy)
        return self.model
