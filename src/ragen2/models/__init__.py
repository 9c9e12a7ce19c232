"""Loading HF causal LMs: any name or path, the built-in SmolLM2-135M-Instruct, a tiny random model, and LoRA
adapters on any of them."""

from ragen2.models.loading import (
    BUILTIN,
    TINY,
    ModelConfig,
    cache_root,
    load_model,
    load_tokenizer,
    resolve_model_path,
)
from ragen2.models.lora import LoRAConfig

__all__ = [
    "BUILTIN",
    "TINY",
    "LoRAConfig",
    "ModelConfig",
    "cache_root",
    "load_model",
    "load_tokenizer",
    "resolve_model_path",
]
