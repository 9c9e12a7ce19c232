"""ChatRenderer: the context grows by appending ids (docs/method.md §2), checked against ChatML written by hand,
under SmolLM2's tokenizer and Qwen2.5-Instruct's; history-rewriting templates (Qwen3's) refused as one sequence
and rendered turn by turn (``TurnRenderer``, rollout.layout=per_turn)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from ragen2.agent import AgentConfig, ChatRenderer, EpisodeRunner, check_chat_template, template_fragments
from ragen2.agent.render import TurnRenderer, assistant_message
from ragen2.errors import ConfigError
from ragen2.rollout import SamplingParams

SYSTEM = "You push boxes.\nActions: Up, Down, Left, Right."
# Qwen3-4B-Thinking-2507's chat template as published (its tokenizer_config.json): it moves the last
# assistant turn's reasoning into "<think>\n…\n</think>\n\n" and drops it from turns before the last query
QWEN3_TEMPLATE = (Path(__file__).parent / "qwen3_chat_template.jinja").read_text().removesuffix("\n")


@pytest.fixture(params=["tokenizer", "qwen_tokenizer"])
def tokenizer(request):
    """SmolLM2's tokenizer and Qwen2.5-Instruct's (the session fixtures): every test runs under both."""
    return request.getfixturevalue(request.param)


def _enc(tokenizer, text: str) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=False))


def _user(text: str) -> dict[str, str]:
    """The next user message, the last of the conversation ``next_prompt`` is handed."""
    return {"role": "user", "content": text}


def test_chatml_fragments(tokenizer) -> None:
    f = template_fragments(tokenizer, SYSTEM)
    assert f.closer == "<|im_end|>\n"
    assert f.user_prefix == "<|im_start|>user\n"
    assert f.user_suffix == "<|im_end|>\n<|im_start|>assistant\n"


def test_first_prompt_is_the_template_plus_forced_think(tokenizer) -> None:
    r = ChatRenderer(tokenizer, SYSTEM)
    ids = r.first_prompt("Turn 1: the grid")
    want = f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\nTurn 1: the grid<|im_end|>\n<|im_start|>assistant\n<think>"
    assert tokenizer.decode(ids) == want
    assert ids == _enc(tokenizer, want)
    assert ids[-3:] == _enc(tokenizer, "<think>")  # the forced <think> is the prompt's last tokens


def test_next_prompt_appends_sampled_closer_and_user(tokenizer) -> None:
    r = ChatRenderer(tokenizer, SYSTEM)
    p1 = r.first_prompt("state one")
    sampled = _enc(tokenizer, "go up</think><answer>Up</answer>")
    p2 = r.next_prompt(p1, sampled, [_user("state two")])
    assert p2[: len(p1)] == p1
    assert p2[len(p1) : len(p1) + len(sampled)] == sampled
    rest = p2[len(p1) + len(sampled) :]
    closer = _enc(tokenizer, "<|im_end|>\n")
    assert tokenizer.decode(closer) == "<|im_end|>\n"
    assert rest[: len(closer)] == closer
    user = "<|im_start|>user\nstate two<|im_end|>\n<|im_start|>assistant\n<think>"
    assert rest[len(closer) :] == _enc(tokenizer, user)


def test_sampled_eos_is_not_duplicated(tokenizer) -> None:
    r = ChatRenderer(tokenizer, SYSTEM)
    eos = tokenizer.eos_token_id
    assert tokenizer.decode([eos]) == "<|im_end|>"
    p1 = r.first_prompt("state one")
    sampled = [*_enc(tokenizer, "go up</think><answer>Up</answer>"), eos]
    p2 = r.next_prompt(p1, sampled, [_user("state two")])
    rest = p2[len(p1) + len(sampled) :]
    assert tokenizer.decode(rest).startswith("\n<|im_start|>user\n")
    assert p2[len(p1) :].count(eos) == 2  # the sampled one closes turn 1; the other closes user turn 2
    assert tokenizer.decode(p2[len(p1) :]) == (
        "go up</think><answer>Up</answer><|im_end|>\n<|im_start|>user\nstate two<|im_end|>\n"
        "<|im_start|>assistant\n<think>"
    )


def test_empty_sampled_turn_still_gets_a_closer(tokenizer) -> None:
    r = ChatRenderer(tokenizer, SYSTEM)
    p1 = r.first_prompt("s")
    p2 = r.next_prompt(p1, [], [_user("t")])
    assert tokenizer.decode(p2[len(p1) :]).startswith("<|im_end|>\n<|im_start|>user\nt")


def test_appended_text_equals_the_template_render_of_the_conversation(tokenizer) -> None:
    """Growing by ids gives the text the template would render, with each assistant turn starting at <think>."""
    r = ChatRenderer(tokenizer, SYSTEM)
    users = ["state one", "state two\nwith lines", "state three"]
    replies = ["a</think><answer>Up</answer>", "b</think><answer>Left || Down</answer>"]
    prompt = r.first_prompt(users[0])
    for reply, user in zip(replies, users[1:], strict=True):
        prompt = r.next_prompt(prompt, _enc(tokenizer, reply), [_user(user)])
    messages = [{"role": "system", "content": SYSTEM}]
    for i, user in enumerate(users):
        messages.append({"role": "user", "content": user})
        if i < len(replies):
            messages.append({"role": "assistant", "content": "<think>" + replies[i]})
    want = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) + "<think>"
    assert tokenizer.decode(prompt) == want


def test_history_rewriting_template_is_refused(tokenizer) -> None:
    tok = copy.deepcopy(tokenizer)
    # drops every assistant message but the last, as reasoning-stripping templates do
    tok.chat_template = (
        "{% for m in messages %}{% if m['role'] != 'assistant' or loop.last %}"
        "<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endif %}{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    with pytest.raises(ConfigError, match="a later turn changes how it renders the earlier ones"):
        ChatRenderer(tok, SYSTEM)


def test_a_generation_prompt_unlike_the_assistant_header_is_refused(tokenizer) -> None:
    tok = copy.deepcopy(tokenizer)
    # keeps history, but prompts generation with a header its own assistant turns do not have
    tok.chat_template = (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n<think>\n{% endif %}"
    )
    with pytest.raises(ConfigError, match="other text than its generation prompt"):
        check_chat_template(tok)


def qwen3_tokenizer(folder: Path):
    """Qwen's tokenizer with Qwen3's published template, loaded from a folder as a user's model would be."""
    from ragen2.models import load_tokenizer, resolve_model_path

    folder.mkdir()
    built = Path(resolve_model_path("tiny-qwen2"))
    (folder / "tokenizer.json").symlink_to(built / "tokenizer.json")
    config = json.loads((built / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": QWEN3_TEMPLATE}))
    return load_tokenizer(str(folder))


def test_qwen3_template_is_refused_as_one_sequence_in_one_line_naming_the_model_and_the_fix(
    tmp_path: Path,
) -> None:
    folder = tmp_path / "Qwen3-like"
    tok = qwen3_tokenizer(folder)
    rendered = tok.apply_chat_template(
        [{"role": "user", "content": "u"}, {"role": "assistant", "content": "<think>r</think>a"}],
        tokenize=False,
    )
    assert rendered.endswith("<think>\nr\n</think>\n\na<|im_end|>\n")  # the real template, applied
    with pytest.raises(ConfigError) as refused:
        EpisodeRunner(lambda: None, tok, AgentConfig(layout="sequence"), SamplingParams())
    message = str(refused.value)
    assert "\n" not in message
    assert message.startswith(
        f"model.name_or_path='{folder}': its chat template does not keep history verbatim"
    )
    assert "rewrites an assistant turn's <think>" in message and "Fix: rollout.layout=per_turn" in message


def test_auto_takes_one_sequence_per_turn_for_qwen3_and_one_per_episode_for_chatml(
    tmp_path: Path, tokenizer, caplog: pytest.LogCaptureFixture
) -> None:
    qwen3 = qwen3_tokenizer(tmp_path / "Qwen3-like")
    with caplog.at_level("INFO", logger="ragen2"):
        assert EpisodeRunner(lambda: None, qwen3, AgentConfig(), SamplingParams()).layout == "per_turn"
    assert "rollout.layout=per_turn" in caplog.text and "rewrites earlier turns" in caplog.text
    assert check_chat_template(tokenizer, "auto") == "sequence"
    assert check_chat_template(tokenizer, "per_turn") == "per_turn"  # as set, on any template
    with pytest.raises(
        ConfigError, match=r"^rollout.layout='turns' is not a layout. Fix: rollout.layout=auto"
    ):
        check_chat_template(tokenizer, "turns")


def test_each_turn_s_prompt_is_the_conversation_as_qwen3_renders_it(tmp_path: Path) -> None:
    """Turn 2's prompt drops turn 1's reasoning, as the template does, and opens its own <think> once."""
    tok = qwen3_tokenizer(tmp_path / "Qwen3-like")
    r = TurnRenderer(tok, SYSTEM)
    p1 = r.first_prompt("state one")
    assert tok.decode(p1).endswith("<|im_start|>user\nstate one<|im_end|>\n<|im_start|>assistant\n<think>\n")
    sampled = [*_enc(tok, "go up because of the hole</think><answer>Up</answer>"), tok.eos_token_id]
    conversation = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "state one"},
        assistant_message(tok, sampled),
        _user("state two"),
    ]
    assert conversation[2]["content"] == "<think>go up because of the hole</think><answer>Up</answer>"
    p2 = r.next_prompt(p1, sampled, conversation)
    text = tok.decode(p2)
    assert text == tok.apply_chat_template(conversation, tokenize=False, add_generation_prompt=True)
    assert (
        "because of the hole" not in text and "<|im_start|>assistant\n<answer>Up</answer><|im_end|>" in text
    )
    assert p2[: len(p1)] != p1 + sampled  # not a prefix: the template rewrote turn 1
