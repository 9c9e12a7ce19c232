"""Loading HF causal LMs: any name or path, the built-in SmolLM2-135M-Instruct, and a tiny random model."""

from ragen2.models.loading import (
    BUILTIN,
    TINY,
    ModelConfig,
    cache_root,
    load_model,
    load_tokenizer,
    resolve_model_path,
)

__all__ = [
    "BUILTIN",
    "TINY",
    "ModelConfig",
    "cache_root",
    "load_model",
    "load_tokenizer",
    "resolve_model_path",
]
