"""A word-level tokenizer with a ChatML template, for models with a task vocabulary (``ragen2.organism``).

Words are what the ``Whitespace`` pre-tokenizer splits (``\\w+`` or a run of punctuation); the vocabulary
is every word of a corpus, in order of first appearance after the special tokens, so it is the same for the
same corpus. Tags such as ``<think>`` and phrases (a protocol's fixed sentences: one token each, as a BPE
vocabulary holds its corpus's frequent strings whole) are added tokens, matched in the raw text before the
split, the longest first. A decoded text joins its tokens with single spaces: the agent's parser and the
reasoning grammar read whitespace runs as one space.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

BOS, EOS, PAD, UNK = "<|im_start|>", "<|im_end|>", "<|pad|>", "[UNK]"
CHATML = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
ROLES = ("system", "user", "assistant")


def word_tokenizer(
    corpus: Iterable[str], tags: Sequence[str] = (), phrases: Sequence[str] = ()
) -> Any:  # -> PreTrainedTokenizerFast
    """A fast tokenizer over the words of ``corpus`` and the chat roles, with ``tags`` and ``phrases`` as whole
    tokens (a phrase's words stay in the vocabulary: text that differs from it by a character splits)."""
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    split = pre_tokenizers.Whitespace()
    vocab: dict[str, int] = {}
    for word in [PAD, UNK, BOS, EOS, *tags, *ROLES, *phrases]:
        vocab.setdefault(word, len(vocab))
    for text in [*corpus, *phrases]:
        for word, _ in split.pre_tokenize_str(text):
            vocab.setdefault(word, len(vocab))
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    core.pre_tokenizer = split
    core.add_special_tokens([AddedToken(t, special=True) for t in (PAD, UNK, BOS, EOS)])
    core.add_tokens([AddedToken(t, special=False, normalized=False) for t in [*tags, *phrases]])
    return PreTrainedTokenizerFast(
        tokenizer_object=core,
        bos_token=None,
        eos_token=EOS,
        pad_token=PAD,
        unk_token=UNK,
        chat_template=CHATML,
        clean_up_tokenization_spaces=False,
    )
