"""Loading HF causal LMs: any name or path, the built-in SmolLM2-135M-Instruct, and tiny random models (a
Llama with SmolLM2's tokenizer, a Qwen2 with Qwen2.5's)."""

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

__all__ = [
    "BUILTIN",
    "TINY",
    "TINY_QWEN2",
    "ModelConfig",
    "cache_root",
    "load_model",
    "load_tokenizer",
    "resolve_model_path",
]
