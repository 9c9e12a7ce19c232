"""Fused projections for decoding: a decoder layer's q/k/v projections as one matmul, and gate/up as one.

A decode step at a few hundred rows is a chain of small matmuls, each reading its weight once; launching three
(q, k, v) where one would do costs a kernel and a pass over the input per projection. On a GPU the step's
matmuls alone ran 1.16× faster fused than one by one, both replayed from a CUDA graph (Qwen2.5-3B's shape at
128 rows on an H200, ``bench_sampler.py decode``'s ``fused`` column, bench/results/gpu.json).

``FusedProjections`` swaps, for the duration of a ``with``, each group's first projection for a module that
runs the group's concatenated weight once and hands the other members their slices, which they return instead
of running their own. It relies on the order the model calls them in (q, k, v; gate, up: every decoder class
of ``GROUPS``), on every member reading the same input, and on no member being a LoRA layer, so it fuses only
the attention and MLP classes it names and leaves every other module as it is (a LoRA layer, an unknown class:
unfused, exact). The concatenated weights are a copy (for Qwen2.5-3B in bf16 about 3.6 GB), written again in
place only when the weights changed (``weights_version``). Results equal the unfused model's up to the
matmul's rounding (a different blocking of the same sums).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn

from ragen2.models.weights import weights_version

#: the submodule classes whose projections run in this order on one input, by class name: the groups
#: fused in each (Llama's, Mistral's, Qwen2's and Qwen3's decoder layers)
GROUPS: dict[str, tuple[tuple[str, ...], ...]] = {
    **dict.fromkeys(
        ("LlamaAttention", "MistralAttention", "Qwen2Attention", "Qwen3Attention"),
        (("q_proj", "k_proj", "v_proj"),),
    ),
    **dict.fromkeys(("LlamaMLP", "MistralMLP", "Qwen2MLP", "Qwen3MLP"), (("gate_proj", "up_proj"),)),
}


class _Group:
    """One group's concatenated weight and bias; the outputs of its last run that members have yet to take."""

    def __init__(self, members: list[nn.Linear]) -> None:
        self.members = members
        self.weight = torch.cat(self._parts("weight"))
        self.bias = torch.cat(self._parts("bias")) if members[0].bias is not None else None
        self.sizes = [m.out_features for m in members]
        self.pending: list[torch.Tensor] = []

    def _parts(self, name: str) -> list[torch.Tensor]:
        return [getattr(m, name).detach() for m in self.members]

    def refresh(self) -> None:
        """The members' current weights, written into the same tensors (no new GBs every iteration)."""
        torch.cat(self._parts("weight"), out=self.weight)
        if self.bias is not None:
            torch.cat(self._parts("bias"), out=self.bias)


class _First(nn.Module):
    """The group's first member: one matmul for all, its own slice returned, the others' kept for them."""

    def __init__(self, group: _Group) -> None:
        super().__init__()
        self.group = group

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.nn.functional.linear(x, self.group.weight, self.group.bias).split(self.group.sizes, -1)
        # list(): a starred unpacking traced by torch.compile (torch 2.11) came back a tuple after a graph break
        self.group.pending = list(out[1:])
        return out[0]


class _Taken(nn.Module):
    """A later member: its slice of the first member's run (its own input is that same tensor)."""

    def __init__(self, group: _Group, name: str) -> None:
        super().__init__()
        self.group = group
        self.name = name

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.group.pending:
            raise RuntimeError(
                f"fused projections: {self.name} ran before its group's first member. "
                "Fix: rollout.sampler.fuse_projections=false"
            )
        return self.group.pending.pop(0)


def _fusable(parent: nn.Module, names: tuple[str, ...]) -> list[nn.Linear] | None:
    """The group's members, if all are plain ``nn.Linear`` (a LoRA layer or any subclass runs its own forward)
    on one input size, all with a bias or none, in one dtype."""
    members = [m for m in (getattr(parent, n, None) for n in names) if type(m) is nn.Linear]
    if len(members) != len(names):
        return None
    alike = all(
        len({key(m) for m in members}) == 1
        for key in (lambda m: m.in_features, lambda m: m.bias is None, lambda m: m.weight.dtype)
    )
    return members if alike else None


class FusedProjections:
    """``with fused(model):`` runs ``model`` with the groups of ``GROUPS`` fused. The fused weights are built
    once per model and written again, in place, whenever its weights changed."""

    def __init__(self) -> None:
        self._model: nn.Module | None = None
        self._version: tuple[int, int] | None = None
        self._swaps: list[tuple[nn.Module, dict[str, nn.Module]]] = []
        self._groups: list[_Group] = []

    @property
    def groups(self) -> int:
        """Fused groups in the model last run (0: it ran unchanged)."""
        return len(self._groups)

    def _build(self, model: nn.Module) -> None:
        self._swaps, self._groups = [], []  # the old copies go before the new ones are made
        for parent in model.modules():
            for names in GROUPS.get(type(parent).__name__, ()):
                members = _fusable(parent, names)
                if members is None:
                    continue
                group = _Group(members)
                self._groups.append(group)
                new: dict[str, nn.Module] = {names[0]: _First(group)}
                new |= {n: _Taken(group, n) for n in names[1:]}
                self._swaps.append((parent, new))
        self._model = model

    @contextmanager
    def __call__(self, model: nn.Module) -> Iterator[None]:
        version = weights_version(model)
        if self._model is not model:
            self._build(model)
        elif self._version != version:
            for group in self._groups:
                group.refresh()
        self._version = version
        originals = [(parent, {n: parent._modules[n] for n in new}) for parent, new in self._swaps]
        try:
            for parent, new in self._swaps:
                parent._modules.update(new)
            yield
        finally:
            for parent, old in originals:
                parent._modules.update(old)
            for group in self._groups:
                group.pending = []
