"""LoRA adapters (PEFT) on the policy's decoder: ``model.lora`` (null = the whole model trains).

``LoRAConfig.attach`` injects PEFT's LoRA layers into an HF causal LM in place and freezes everything
else: the model keeps its class (a ``PreTrainedModel``, so every consumer of the policy, the HF sampler
and the MI pass included, runs the adapted model as it is), each targeted ``nn.Linear`` becomes
``<name>.base_layer`` (frozen) plus ``<name>.lora_A/lora_B.default`` (trained), and the output is
``W x + (alpha / rank) · B A x``. B starts at zero, so the adapted model starts as the base model; A is
drawn from a fixed seed, so every rank (FSDP shards without a broadcast) and every rebuild of a run
starts from the same adapters.

What LoRA changes around the update:

- the frozen reference of a KL term is the policy with its adapters off (``adapters_off``: PEFT's
  switch, what ``PeftModel.disable_adapter()`` does), not a second copy of the model;
- a checkpoint holds the adapters and their optimizer state, not the frozen base that ``model.*`` names
  (``ragen2.modules.policy``); ``load_policy`` (``ragen2.models.checkpoint``) rebuilds the model from both;
- a rollout engine gets the merged weights under the plain model's names (``merged_tensors``: W + s·B A
  per adapted layer), which is also what ``ragen2-export`` writes unless it is asked for the adapters.

Targets are ``nn.Linear`` layers of the decoder, named as PEFT names them (a module whose name is the
entry or ends with ``.<entry>``); each entry must match at least one, checked at start-up against the
model's structure (built on the meta device, no weights read).
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

from ragen2.errors import ConfigError

ADAPTER = "default"  # PEFT's name of the one adapter a run trains
INIT_SEED = 0  # the adapters' A matrices are drawn from this seed, whatever the global RNG holds
_KEY = "model.lora"
#: the linear layers of a Llama/Qwen2 decoder layer: attention and MLP projections
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class LoRAConfig:
    """``model.lora``: low-rank adapters on the decoder's linear layers; only they train."""

    rank: int = 16
    """The adapters' rank r (A is r × in, B is out × r)."""
    alpha: int = 32
    """Scale: each adapter adds (alpha / rank) · B A x to its layer's output."""
    target_modules: tuple[str, ...] = PROJECTIONS
    """Decoder linear layers to adapt, by name or name suffix (PEFT's matching): q_proj, …, down_proj."""
    dropout: float = 0.0
    """Dropout on the adapters' input in training forwards (no-grad scoring passes included), in [0, 1)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "target_modules", tuple(self.target_modules))
        checks = (
            ("rank", self.rank, self.rank >= 1, "≥ 1", f"{_KEY}.rank=16"),
            ("alpha", self.alpha, self.alpha > 0, "> 0", f"{_KEY}.alpha=32 (twice the rank is usual)"),
            ("dropout", self.dropout, 0 <= self.dropout < 1, "in [0, 1)", f"{_KEY}.dropout=0.0"),
        )
        for key, value, ok, allowed, fix in checks:
            if not ok:
                raise ConfigError(f"{_KEY}.{key}={value} is out of range: it must be {allowed}. Fix: {fix}")
        if not self.target_modules:
            raise ConfigError(
                f"{_KEY}.target_modules=[] names no layer, so nothing would train. "
                f"Fix: {_KEY}.target_modules=[{','.join(PROJECTIONS)}]"
            )

    def check_targets(self, model: Any, source: str) -> None:
        """Refuse an entry of ``target_modules`` that matches no ``nn.Linear`` of ``model``'s decoder, or that
        matches a module that is not one (PEFT would adapt layers outside the decoder or fail on it).
        ``source`` names the setting the model came from (``model.name_or_path='tiny'``)."""
        decoder = model.get_decoder()
        inside = next(name for name, module in model.named_modules() if module is decoder)
        linear = sorted(
            {name.rsplit(".", 1)[-1] for name, m in decoder.named_modules() if isinstance(m, torch.nn.Linear)}
        )
        shown = f"{_KEY}.target_modules=[{','.join(self.target_modules)}]"
        for entry in self.target_modules:
            matched = [
                (name, module)
                for name, module in model.named_modules()
                if name == entry or name.endswith(f".{entry}")
            ]
            wrong = [
                name
                for name, module in matched
                if not isinstance(module, torch.nn.Linear) or not name.startswith(f"{inside}.")
            ]
            if not matched or wrong:
                what = (
                    f"matches {wrong[0]}, not one of the decoder's linear layers"
                    if wrong
                    else "matches no module"
                )
                raise ConfigError(
                    f"{shown}: {entry!r} {what} of {source}. Fix: name the "
                    f"decoder's linear layers, e.g. {_KEY}.target_modules=[{','.join(linear)}]"
                )

    def peft_config(self) -> Any:  # -> peft.LoraConfig
        from peft import LoraConfig, TaskType

        return LoraConfig(
            task_type=TaskType.CAUSAL_LM,
            r=self.rank,
            lora_alpha=self.alpha,
            target_modules=list(self.target_modules),
            lora_dropout=self.dropout,
            bias="none",
        )

    def wrap(self, model: Any, source: str) -> Any:  # -> peft.PeftModel
        """``model`` with adapters injected, inside PEFT's ``PeftModel`` (for merging and saving adapters);
        the base frozen, the adapters in fp32 over a half-precision base."""
        from peft import get_peft_model

        self.check_targets(model, source)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(INIT_SEED)
            return get_peft_model(model, self.peft_config())

    def attach(self, model: Any, source: str) -> Any:
        """``model`` itself (same class, same tensors) with trainable adapters injected, the rest frozen."""
        return self.wrap(model, source).get_base_model()


def _lora_layers(model: torch.nn.Module) -> dict[str, Any]:
    """The model's LoRA layers by module name (none when PEFT was never imported: nothing injected any)."""
    if "peft" not in sys.modules:
        return {}
    from peft.tuners.lora import LoraLayer

    return {name: m for name, m in model.named_modules() if isinstance(m, LoraLayer)}


def has_adapters(model: torch.nn.Module) -> bool:
    """Whether ``model`` holds LoRA layers (``LoRAConfig.attach`` put them there)."""
    return bool(_lora_layers(model))


@contextmanager
def adapters_off(model: torch.nn.Module) -> Iterator[None]:
    """Run ``model`` as its base model: every LoRA layer's adapters disabled (PEFT's own switch, as in
    ``PeftModel.disable_adapter()``), then enabled again with each parameter's ``requires_grad`` as it was."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    layers = [m for m in model.modules() if isinstance(m, BaseTunerLayer)]
    trained = [(p, p.requires_grad) for p in model.parameters()]
    for layer in layers:
        layer.enable_adapters(False)
    try:
        yield
    finally:
        for layer in layers:
            layer.enable_adapters(True)
        for p, flag in trained:
            p.requires_grad_(flag)


def _owner(name: str, layers: dict[str, Any]) -> tuple[str | None, str]:
    """(the LoRA layer that holds the tensor ``name``, the rest of the name), or (None, name)."""
    parts = name.split(".")
    for i in range(len(parts) - 1, 0, -1):
        prefix = ".".join(parts[:i])
        if prefix in layers:
            return prefix, ".".join(parts[i:])
    return None, name


def merged_tensors(
    model: torch.nn.Module, named: Iterable[tuple[str, torch.Tensor]]
) -> Iterator[tuple[str, torch.Tensor]]:
    """``named`` (``model``'s state-dict names and tensors, in registration order) as the plain model's:
    each LoRA layer's ``base_layer.weight`` W, ``lora_A`` A and ``lora_B`` B become one ``weight``
    W + (alpha / rank) · B A (computed in fp32, in W's dtype), its ``base_layer.bias`` its ``bias``.
    Consumes ``named`` in order (an FSDP gather is a collective) and holds one layer's tensors at a time."""
    layers = _lora_layers(model)
    held: dict[str, dict[str, torch.Tensor]] = {}
    for name, tensor in named:
        owner, rest = _owner(name, layers)
        if owner is None:
            yield name, tensor
            continue
        part = rest.split(".", 1)[0]
        if rest != "base_layer.weight" and part not in ("lora_A", "lora_B"):
            yield f"{owner}.{rest.removeprefix('base_layer.')}", tensor  # the base layer's bias
            continue
        parts = held.setdefault(owner, {})
        parts[part] = tensor
        if len(parts) == 3:
            del held[owner]
            base = parts["base_layer"]
            delta = (parts["lora_B"].float() @ parts["lora_A"].float()) * layers[owner].scaling[ADAPTER]
            yield f"{owner}.weight", (base.float() + delta).to(base.dtype)
    assert not held, f"LoRA layers without all of base weight, A and B: {sorted(held)}"
