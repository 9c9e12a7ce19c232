"""Loading HF causal LMs: any name or path, the built-in SmolLM2-135M-Instruct, tiny random models (a Llama
with SmolLM2's tokenizer, a Qwen2 with Qwen2.5's), and LoRA adapters on any of them."""

from ragen2.models.loading import (
    BUILTIN,
    TINY,
    TINY_QWEN2,
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
    "TINY_QWEN2",
    "LoRAConfig",
    "ModelConfig",
    "cache_root",
    "load_model",
    "load_tokenizer",
    "resolve_model_path",
]
