"""EpisodeRunner: the token contract (docs/method.md §2) and the agent protocol (§7) on real envs and samplers.

The samplers' outputs are captured by a recording wrapper, so the checks compare the episodes against
what the sampler really returned (and what it was really fed), never against the Turn objects alone.
"""

from __future__ import annotations

import contextlib
import copy
import itertools
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, ClassVar

import pytest
import ragen2_envs
import torch
from ragen2_envs.sokoban.env import SokobanEnv

from ragen2.agent import AgentConfig, Episode, EpisodeRunner
from ragen2.agent.episode import record_messages
from ragen2.agent.render import assistant_message, turn_one_ids
from ragen2.agent.runner import NO_OBSERVATION, user_message
from ragen2.data.batch import by_group, collate_episodes
from ragen2.data.record import RolloutStats
from ragen2.rollout import PromptMeta, Sample, SamplingParams
from ragen2.rollout.hf import HFSampler
from ragen2.rollout.scripted import DEFAULT_RESPONSES, ScriptedSampler

from .test_render import qwen3_tokenizer

SOKOBAN = "ragen2/Sokoban-v0"
# Sokoban seed 2 (6×6, 1 box): the player P stands in the bottom-left corner, so Down and Left hit walls
#   ######
#   #_####
#   #____#
#   #_XO_#
#   #P___#
#   ######
CORNER_SEED = 2
# Sokoban seed 0 has an optimal solution of L = 5 moves
SOLVE_SEED, SOLVE_LENGTH = 0, 5


@dataclass
class Call:
    prompts: list[list[int]]
    ids: list[list[int]]
    logprobs: list[list[float] | None]
    finish: list[str]
    meta: list[PromptMeta] | None


@dataclass
class Recorder:
    """Wraps a real sampler and keeps deep copies of every call's inputs and outputs."""

    inner: Any
    calls: list[Call] = field(default_factory=list)

    @property
    def needs_oracle(self) -> bool:
        return self.inner.needs_oracle

    def sync_weights(self, model: Any) -> None:
        self.inner.sync_weights(model)

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        params: SamplingParams,
        seed: int,
        meta: Sequence[PromptMeta] | None = None,
    ) -> list[Sample]:
        snapshot = [list(p) for p in prompts]
        out = self.inner.generate(prompts, params, seed, meta)
        self.calls.append(
            Call(
                prompts=snapshot,
                ids=[list(s.ids) for s in out],
                logprobs=[None if s.logprobs is None else list(s.logprobs) for s in out],
                finish=[s.finish_reason for s in out],
                meta=None if meta is None else copy.deepcopy(list(meta)),
            )
        )
        return out


def _enc(tokenizer, text: str) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=False))


def _runner(
    tokenizer, env_id: str = SOKOBAN, cfg: AgentConfig | None = None, max_new_tokens: int = 64, **env_kw
):
    return EpisodeRunner(
        partial(ragen2_envs.make, env_id, **env_kw),
        tokenizer,
        cfg or AgentConfig(),
        SamplingParams(max_new_tokens=max_new_tokens),
        env_id=env_id,
    )


def _run(tokenizer, responses: Sequence[str], seeds=(CORNER_SEED,), group_size=1, **kw) -> list[Episode]:
    return _runner(tokenizer, **kw).collect(
        ScriptedSampler(tokenizer, responses), seeds, group_size, sample_seed=0
    )


def check_token_contract(episodes: list[Episode], rec: Recorder, runner: EpisodeRunner, env_kw=None) -> None:
    """Every docs/method.md §2 property of the runner's output, against the recorded sampler calls."""
    tok, cfg, params = runner.tokenizer, runner.cfg, runner.params
    eos = tok.eos_token_id
    think = _enc(tok, "<think>")
    budget = cfg.max_turns * cfg.max_actions_per_turn

    # 1. the training ids of every turn are the sampler's returned ids; every prompt is what it was fed
    assert len(rec.calls) == max(len(ep.turns) for ep in episodes)
    sampled_by_episode: dict[int, list[list[int]]] = {id(ep): [] for ep in episodes}
    for t, call in enumerate(rec.calls):
        active = [ep for ep in episodes if len(ep.turns) > t]  # the runner keeps the episodes' order
        assert len(active) == len(call.prompts) == len(call.ids)
        for ep, prompt, ids, logprobs in zip(active, call.prompts, call.ids, call.logprobs, strict=True):
            turn, seq = ep.turns[t], ep.token_ids
            assert seq[turn.start : turn.end] == ids
            assert seq[: turn.start] == prompt
            assert turn.sampler_logprobs == logprobs
            sampled_by_episode[id(ep)].append(ids)

    example = runner.env_factory().example_action()  # fixed per env: the user message's example reply
    for ep in episodes:
        seq = ep.token_ids
        # 2. the first prompt is the chat template over the system prompt and the first user message
        first = ep.turns[0]
        user1 = user_message(1, first.observation, budget, cfg, params.max_new_tokens, example)
        messages = [{"role": "system", "content": ep.system_prompt}, {"role": "user", "content": user1}]
        want = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) + "<think>"
        assert first.prompt_ids == _enc(tok, want)

        # 3. turn t+1's prompt = turn t's prompt + sampled ids + closer + rendered user message
        used = 0
        for t, turn in enumerate(ep.turns[:-1]):
            used += len(turn.actions)
            nxt = ep.turns[t + 1].prompt_ids
            assert nxt[: turn.end] == [*turn.prompt_ids, *turn.sampled_ids]
            rest = nxt[turn.end :]
            if turn.sampled_ids[-1:] == [eos]:  # the sampled EOS closes the turn: not duplicated
                closer = _enc(tok, "\n")
                assert tok.decode([eos, *closer]) == "<|im_end|>\n"
                assert rest[:1] != [eos]
            else:
                closer = _enc(tok, "<|im_end|>\n")
                assert closer[0] == eos
            assert tok.decode(rest[: len(closer)]) == tok.decode(closer)
            assert rest[: len(closer)] == closer
            user = user_message(
                t + 2, ep.turns[t + 1].observation, max(0, budget - used), cfg, params.max_new_tokens, example
            )
            assert rest[len(closer) :] == _enc(
                tok, f"<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n<think>"
            )

        # 4. the loss-mask spans: disjoint, increasing, inside, exactly the sampled ids
        spans = [(t.start, t.end) for t in ep.turns]
        assert all(0 < s <= e <= len(seq) for s, e in spans)
        assert spans[-1][1] == len(seq)
        assert all(e0 < s1 for (_, e0), (s1, _) in itertools.pairwise(spans))
        mask = [False] * len(seq)
        for s, e in spans:
            mask[s:e] = [True] * (e - s)
        assert [x for x, m in zip(seq, mask, strict=True) if m] == [
            i for ids in sampled_by_episode[id(ep)] for i in ids
        ]
        for s, _ in spans:  # the forced <think> right before each span is prompt, not loss
            assert seq[s - len(think) : s] == think
            assert not any(mask[s - len(think) : s])
        unmasked = tok.decode([x for x, m in zip(seq, mask, strict=True) if not m])
        assert unmasked.startswith("<|im_start|>system\n")
        for turn in ep.turns:  # every env observation is in the unmasked text
            assert turn.observation in unmasked

        # 5. the observations are the env's own: reset, then replay the executed actions
        env = ragen2_envs.make(ep.env_id, **(env_kw or {}))
        obs, _ = env.reset(seed=ep.seed, options={"sample": ep.sample})
        assert first.observation == obs
        for t, turn in enumerate(ep.turns[:-1]):
            for action in turn.actions:
                env.step(action)
            assert ep.turns[t + 1].observation == env.render_state()


# ---- the token contract on real episodes ---------------------------------------------------------


def check_sampler_logprobs(rec: Recorder, model: Any) -> None:
    """Every sampled id's log-prob as the sampler returned it equals the model's given the prompt it was fed."""
    for call in rec.calls:
        for prompt, ids, logprobs in zip(call.prompts, call.ids, call.logprobs, strict=True):
            with torch.no_grad():
                logits = model(input_ids=torch.tensor([prompt + ids])).logits[0, len(prompt) - 1 : -1]
            want = torch.log_softmax(logits.float(), -1).gather(-1, torch.tensor(ids)[:, None]).squeeze(-1)
            torch.testing.assert_close(torch.tensor(logprobs), want, atol=1e-4, rtol=0)


# SmolLM2's tokenizer and 49k vocabulary; Qwen2.5's tokenizer, ChatML template and 151,936-row vocabulary
TINY_MODELS = [("tokenizer", "tiny_model"), ("qwen_tokenizer", "tiny_qwen2")]


@pytest.mark.parametrize(("tokenizer_fixture", "model_fixture"), TINY_MODELS)
def test_token_contract_hf_sampler_tiny_model(
    request: pytest.FixtureRequest, tokenizer_fixture: str, model_fixture: str
) -> None:
    tokenizer, tiny_model = request.getfixturevalue(tokenizer_fixture), request.getfixturevalue(model_fixture)
    runner = _runner(tokenizer, cfg=AgentConfig(max_turns=3), max_new_tokens=12)
    sampler = HFSampler(tokenizer, tiny_model)
    rec = Recorder(sampler)
    episodes = runner.collect(rec, seeds=[0, 1], group_size=2, sample_seed=7)
    assert len(episodes) == 4
    assert [len(ep.turns) for ep in episodes] == [3, 3, 3, 3]  # a random model never solves it
    check_token_contract(episodes, rec, runner)
    # the sampler reuses keys/values across turns and within groups; its log-probs are still exact
    assert sampler.tokens_prefilled < sum(len(p) for call in rec.calls for p in call.prompts) // 2
    check_sampler_logprobs(rec, tiny_model)
    # the random model's text is not well-formed: each turn is penalised once, the episode goes on
    for ep in episodes:
        assert ep.end_reason == "max_turns" and ep.truncated and not ep.terminated
        for turn in ep.turns:
            assert turn.penalty == (0.0 if turn.format_ok and all(turn.actions_valid) else -0.1)


def test_a_qwen3_template_gets_one_sequence_per_turn_each_the_context_it_was_given(
    tmp_path: Path, tiny_qwen2
) -> None:
    """Qwen3's template drops earlier turns' reasoning: each turn's prompt is the conversation as it renders
    it, the sampler's log-probs are the model's given that prompt, and the batch trains each turn's sampled
    ids on its own context (the turns packed in the row: ``Turn.offset``)."""
    tokenizer = qwen3_tokenizer(tmp_path / "Qwen3-like")
    runner = _runner(tokenizer, cfg=AgentConfig(max_turns=3), max_new_tokens=12)
    assert runner.layout == "per_turn"
    rec = Recorder(HFSampler(tokenizer, tiny_qwen2))
    episodes = runner.collect(rec, seeds=[0], group_size=2, sample_seed=7)
    assert [len(ep.turns) for ep in episodes] == [3, 3]
    check_sampler_logprobs(rec, tiny_qwen2)
    batch = collate_episodes(episodes, 1, tokenizer.pad_token_id)
    for row, ep in enumerate(episodes):
        messages = record_messages(ep.to_record(), tokenizer)
        at = 0
        for n, t in enumerate(ep.turns):
            conversation = [*messages[: 2 + 2 * n]]  # the system prompt, then each turn's user and reply
            conversation[2::2] = [assistant_message(tokenizer, u.sampled_ids) for u in ep.turns[:n]]
            assert t.prompt_ids == turn_one_ids(tokenizer, conversation), f"turn {n + 1}"
            assert t.offset == at and t.prompt_ids == rec.calls[n].prompts[row]
            at = t.end
        sampled = batch.input_ids[row][batch.loss_mask[row].bool()].tolist()
        assert sampled == [i for t in ep.turns for i in t.sampled_ids]
        assert batch.sequence_index[row].max() == 3


SCRIPTED = (*DEFAULT_RESPONSES, "Stuck.</think><answer>Down || Left</answer><|im_end|>")


@pytest.mark.parametrize("tokenizer_fixture", [t for t, _ in TINY_MODELS])
def test_token_contract_scripted_sampler(request: pytest.FixtureRequest, tokenizer_fixture: str) -> None:
    tokenizer = request.getfixturevalue(tokenizer_fixture)
    runner = _runner(tokenizer, cfg=AgentConfig(max_turns=5))
    rec = Recorder(ScriptedSampler(tokenizer, SCRIPTED))
    episodes = runner.collect(rec, seeds=[2, 3, 1], group_size=3, sample_seed=0)
    check_token_contract(episodes, rec, runner)
    # the scripted mix exercises every path: EOS-ended turns followed by another turn, unclosed reasoning,
    # episodes that end early (solved) while others go on, so later calls get a subset of the prompts
    assert any(t.sampled_ids[-1] == tokenizer.eos_token_id for ep in episodes for t in ep.turns[:-1])
    assert any(t.reasoning_ids is None for ep in episodes for t in ep.turns)
    sizes = [len(c.prompts) for c in rec.calls]
    assert sizes[0] == 9 and len(set(sizes)) >= 3 and sizes == sorted(sizes, reverse=True)
    assert {ep.end_reason for ep in episodes} == {"terminated", "max_turns"}
    assert all(m.oracle is not None for call in rec.calls[:1] for m in call.meta)


def test_each_group_is_handed_over_once_as_soon_as_it_has_ended(tokenizer) -> None:
    runner = _runner(tokenizer, cfg=AgentConfig(max_turns=5))
    rec = Recorder(ScriptedSampler(tokenizer, SCRIPTED))
    handed: list[tuple[int, int, list[str]]] = []  # (sampler calls so far, seed, end reasons)

    def done(group: list) -> None:
        handed.append((len(rec.calls), group[0].seed, [ep.end_reason for ep in group]))

    episodes = runner.collect(rec, seeds=[2, 3, 1], group_size=3, sample_seed=0, group_done=done)
    assert sorted(seed for _, seed, _ in handed) == [1, 2, 3]  # each group once
    for calls, seed, reasons in handed:
        group = [ep for ep in episodes if ep.seed == seed]
        assert all(reasons) and calls == max(len(ep.turns) for ep in group)  # right after its last turn
    assert [calls for calls, _, _ in handed] == sorted(calls for calls, _, _ in handed)
    assert len({calls for calls, _, _ in handed}) > 1  # some groups were handed over before others ended


@pytest.mark.parametrize("env_id", sorted(ragen2_envs.own_ids()))
def test_every_rollout_of_a_group_sees_the_same_first_prompt(tokenizer, env_id: str) -> None:
    # DeepCoder runs a sandbox on every answer: give it responses with no answer (no env step)
    # (and one action per turn: the runner's multi-move oracle plan would step a copy of the env)
    deepcoder = env_id == "ragen2/DeepCoder-v0"
    responses = ["Let me think.</think>"] if deepcoder else DEFAULT_RESPONSES
    cfg = AgentConfig(max_turns=2, max_actions_per_turn=1 if deepcoder else 2)
    runner = _runner(tokenizer, env_id, cfg=cfg, max_new_tokens=128)
    rec = Recorder(ScriptedSampler(tokenizer, responses))
    seeds = [3, 4]
    episodes = runner.collect(rec, seeds=seeds, group_size=3, sample_seed=0)
    assert [(ep.seed, ep.group, ep.sample) for ep in episodes] == [
        (s, g, k) for g, s in enumerate(seeds) for k in range(3)
    ]
    fed = rec.calls[0].prompts  # what the sampler was really given in turn 1
    by_group: dict[int, list[list[int]]] = {}
    for ep, prompt in zip(episodes, fed, strict=True):
        assert ep.turns[0].prompt_ids == prompt
        by_group.setdefault(ep.group, []).append(prompt)
    for prompts in by_group.values():
        assert all(p == prompts[0] for p in prompts)
    assert by_group[0][0] != by_group[1][0]  # another seed, another instance
    check_token_contract(episodes, rec, runner)


# ---- docs/method.md §7 semantics, hand-computed on Sokoban ------------------------------------------


@pytest.mark.parametrize(
    ("answer", "turn_reward", "turn_penalty", "actions", "valid"),
    [
        # two valid moves into walls: −0.1 each, no penalty
        ("Down || Left", -0.2, 0.0, ["Down", "Left"], [True, True]),
        # an action Sokoban cannot parse: reward 0, format penalty −0.1
        ("Jump", 0.0, -0.1, ["Jump"], [False]),
        # two invalid actions: still the penalty once
        ("Jump || Fly", 0.0, -0.1, ["Jump", "Fly"], [False, False]),
        # one valid wall move (−0.1) and one invalid action: the penalty once (−0.1)
        ("Down || Jump", -0.1, -0.1, ["Down", "Jump"], [True, False]),
        # a third action beyond max_actions_per_turn = 2 is dropped, not executed, not penalised
        ("Down || Left || Up", -0.2, 0.0, ["Down", "Left"], [True, True]),
        ("down||LEFT", -0.2, 0.0, ["down", "LEFT"], [True, True]),  # the env matches names case-insensitively
    ],
)
def test_hand_computed_returns(tokenizer, answer, turn_reward, turn_penalty, actions, valid) -> None:
    (ep,) = _run(tokenizer, [f"Corner.</think><answer>{answer}</answer>"], cfg=AgentConfig(max_turns=3))
    assert len(ep.turns) == 3
    for turn in ep.turns:
        assert turn.actions == actions and turn.actions_valid == valid
        assert turn.reward == pytest.approx(turn_reward)
        assert turn.penalty == turn_penalty
        assert turn.observation == ep.turns[0].observation  # the player never moved
    assert ep.episode_return == pytest.approx(3 * (turn_reward + turn_penalty))
    assert (ep.end_reason, ep.truncated, ep.terminated, ep.success) == ("max_turns", True, False, False)


@pytest.mark.parametrize(
    "response",
    [
        "Corner.<answer>Down</answer>",  # no </think>
        "Corner.</think>",  # no answer
        "Corner.</think><answer></answer>",  # empty answer
        "Corner.</think><answer>Down</answer><answer>Up</answer>",  # two answers
    ],
)
def test_bad_format_is_penalised_and_not_executed(tokenizer, response: str) -> None:
    (ep,) = _run(tokenizer, [response], cfg=AgentConfig(max_turns=2))
    assert [t.penalty for t in ep.turns] == [-0.1, -0.1]
    assert all(t.actions == [] and t.reward == 0.0 and not t.format_ok for t in ep.turns)
    assert ep.episode_return == pytest.approx(-0.2)
    assert ep.end_reason == "max_turns"


def test_turn_ending_in_eos_is_well_formed(tokenizer) -> None:
    (ep,) = _run(tokenizer, ["Corner.</think><answer>Down</answer><|im_end|>"], cfg=AgentConfig(max_turns=2))
    assert ep.turns[0].sampled_ids[-1] == tokenizer.eos_token_id
    assert all(t.format_ok and t.penalty == 0.0 and t.actions == ["Down"] for t in ep.turns)
    assert ep.episode_return == pytest.approx(-0.2)


def test_length_truncated_turn_has_no_z_and_is_penalised(tokenizer) -> None:
    response = "A long chain of careful reasoning about the box.</think><answer>Down</answer>"
    (ep,) = _run(tokenizer, [response], cfg=AgentConfig(max_turns=2), max_new_tokens=6)
    for turn in ep.turns:
        assert turn.finish_reason == "length" and len(turn.sampled_ids) == 6
        assert turn.reasoning_ids is None
        assert turn.penalty == -0.1 and turn.actions == []


def test_reasoning_ids_are_recorded_per_turn(tokenizer) -> None:
    (ep,) = _run(tokenizer, ["Corner.</think><answer>Down</answer>"], cfg=AgentConfig(max_turns=1))
    assert tokenizer.decode(ep.turns[0].reasoning_ids) == "Corner."


@pytest.mark.parametrize("max_actions", [1, 2])
def test_oracle_solves_sokoban(tokenizer, max_actions: int) -> None:
    env = ragen2_envs.make(SOKOBAN)
    _, info = env.reset(seed=SOLVE_SEED)
    assert info["optimal_length"] == SOLVE_LENGTH
    (ep,) = _run(
        tokenizer,
        ["Follow the plan.</think><answer>{oracle}</answer>"],
        seeds=(SOLVE_SEED,),
        cfg=AgentConfig(max_turns=8, max_actions_per_turn=max_actions),
    )
    # {oracle} is the solver's plan for one turn (up to max_actions moves): ⌈L / max_actions⌉ turns.
    # L moves at −0.1, the box onto its target +1, solved +10: 11 − 0.1·L, no penalties
    assert sum(len(t.actions) for t in ep.turns) == SOLVE_LENGTH
    assert len(ep.turns) == -(-SOLVE_LENGTH // max_actions)
    assert all(t.penalty == 0.0 for t in ep.turns)
    assert ep.episode_return == pytest.approx(11 - 0.1 * SOLVE_LENGTH)
    assert (ep.end_reason, ep.terminated, ep.truncated, ep.success) == ("terminated", True, False, True)


def test_invalid_action_before_each_move_is_penalised_once_per_turn(tokenizer) -> None:
    (ep,) = _run(
        tokenizer,
        ["Plan.</think><answer>Jump || {oracle}</answer>"],
        seeds=(SOLVE_SEED,),
        cfg=AgentConfig(max_turns=8, max_actions_per_turn=2),
    )
    # each turn keeps "Jump" (invalid: penalty, no step) and the plan's first move; the rest is dropped, so
    # the L moves take L turns: 11 − 0.1·L − 0.1·L
    assert len(ep.turns) == SOLVE_LENGTH
    assert all(t.actions[0] == "Jump" and t.actions_valid == [False, True] for t in ep.turns)
    assert [t.penalty for t in ep.turns] == [-0.1] * SOLVE_LENGTH
    assert ep.episode_return == pytest.approx(11 - 0.2 * SOLVE_LENGTH)
    assert ep.end_reason == "terminated" and ep.success


def test_actions_after_termination_are_not_executed(tokenizer) -> None:
    # Sokoban seed 2 is solved in 2 moves: the plan solves it and the trailing "Jump" never reaches the env
    (ep,) = _run(
        tokenizer,
        ["Plan.</think><answer>{oracle} || Jump</answer>"],
        seeds=(CORNER_SEED,),
        cfg=AgentConfig(max_turns=3, max_actions_per_turn=3),
    )
    (turn,) = ep.turns
    assert len(turn.actions) == 2 and turn.actions_valid == [True, True]
    assert turn.penalty == 0.0
    assert ep.episode_return == pytest.approx(11 - 0.2)
    assert ep.end_reason == "terminated" and ep.success


def test_env_truncation_ends_the_episode(tokenizer) -> None:
    (ep,) = _run(
        tokenizer, ["Corner.</think><answer>Down || Left</answer>"], cfg=AgentConfig(max_turns=5), max_steps=3
    )
    # steps 1, 2 in turn 1; step 3 (the env's budget) is the first action of turn 2 and truncates
    assert len(ep.turns) == 2
    assert ep.turns[1].actions == ["Down"]
    assert ep.episode_return == pytest.approx(-0.3)
    assert (ep.end_reason, ep.truncated, ep.terminated) == ("env_truncated", True, False)


def test_max_turns_one(tokenizer) -> None:
    (ep,) = _run(tokenizer, ["Corner.</think><answer>Up</answer>"], cfg=AgentConfig(max_turns=1))
    assert len(ep.turns) == 1
    assert (ep.end_reason, ep.truncated) == ("max_turns", True)


def test_context_limit_ends_the_episode_truncated(tokenizer) -> None:
    response = ["Corner.</think><answer>Down</answer>"]
    (full,) = _run(tokenizer, response, cfg=AgentConfig(max_turns=3), max_new_tokens=32)
    p1, p2 = (len(t.prompt_ids) for t in full.turns[:2])
    # the second prompt itself fits, but not with room for max_new_tokens: the episode ends after turn 1
    (ep,) = _run(tokenizer, response, cfg=AgentConfig(max_turns=3, max_context=p2 + 31), max_new_tokens=32)
    assert len(ep.turns) == 1
    assert (ep.end_reason, ep.truncated, ep.terminated) == ("context", True, False)
    assert ep.token_ids == full.token_ids[: ep.turns[0].end]
    (ep,) = _run(tokenizer, response, cfg=AgentConfig(max_turns=3, max_context=p1 + 32), max_new_tokens=32)
    assert len(ep.turns) == 1 and ep.end_reason == "context"
    # the second prompt fits exactly; the third would not
    (ep,) = _run(tokenizer, response, cfg=AgentConfig(max_turns=3, max_context=p2 + 32), max_new_tokens=32)
    assert len(ep.turns) == 2 and ep.end_reason == "context"


def test_first_prompt_that_cannot_fit_is_an_error(tokenizer) -> None:
    response = ["Corner.</think><answer>Down</answer>"]
    (full,) = _run(tokenizer, response, cfg=AgentConfig(max_turns=1), max_new_tokens=32)
    p1 = len(full.turns[0].prompt_ids)
    with pytest.raises(ValueError, match=r"rollout\.max_context"):
        _run(tokenizer, response, cfg=AgentConfig(max_turns=1, max_context=p1 + 31), max_new_tokens=32)


def test_agent_config_is_validated() -> None:
    with pytest.raises(ValueError, match="max_turns"):
        AgentConfig(max_turns=0)
    with pytest.raises(ValueError, match="max_actions_per_turn"):
        AgentConfig(max_actions_per_turn=0)


# ---- env calls that hang: env.step_timeout_s (ragen2.agent.timeout) -----------------------------


def _spin() -> None:
    """A pure-Python hang that even swallows ``except Exception``, as careless env code might."""
    while True:
        with contextlib.suppress(Exception):
            sum(range(1000))


class HangingSokoban(SokobanEnv):
    """Real Sokoban whose ``call`` never returns for one rollout (``sample``) of the instance ``seed``.

    ``call`` is "reset", "step" (the action "Left") or "oracle" (the solver's next move); ``how`` is a
    CPU-bound loop ("spin") or a blocking sleep ("sleep"). Records any call made after the hang.
    """

    made: ClassVar[list[HangingSokoban]] = []

    def __init__(self, call: str, sample: int = 1, seed: int = CORNER_SEED, how: str = "spin") -> None:
        super().__init__()
        self.call, self.hang_sample, self.hang_seed, self.how = call, sample, seed, how
        self.current: tuple[int | None, int] = (None, 0)
        self.hung = False
        self.late_calls: list[str] = []
        HangingSokoban.made.append(self)

    def _maybe_hang(self, call: str) -> None:
        if self.hung:
            self.late_calls.append(call)
        elif call == self.call and self.current == (self.hang_seed, self.hang_sample):
            self.hung = True
            _spin() if self.how == "spin" else time.sleep(3600)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict]:
        self.current = (seed, int((options or {}).get("sample", 0)))
        self._maybe_hang("reset")
        return super().reset(seed=seed, options=options)

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if action == "Left":
            self._maybe_hang("step")
        elif self.hung:
            self.late_calls.append("step")
        return super().step(action)

    def oracle_action(self) -> str | None:
        self._maybe_hang("oracle")
        return super().oracle_action()

    def render_state(self) -> str:
        if self.hung:
            self.late_calls.append("render_state")
        return super().render_state()


def _hanging_runner(tokenizer, call: str, cfg: AgentConfig, **kw: Any) -> EpisodeRunner:
    HangingSokoban.made.clear()
    return EpisodeRunner(
        partial(HangingSokoban, call, **kw), tokenizer, cfg, SamplingParams(max_new_tokens=64), env_id=SOKOBAN
    )


def _check_hung_env_left_alone() -> None:
    (hung,) = [env for env in HangingSokoban.made if env.hung]
    assert hung.late_calls == []  # a hung env instance is never called again


WALLS = "Corner.</think><answer>Down || Left</answer>"  # two moves into walls from the corner: −0.1 each


@pytest.mark.timeout(30)  # without a limit the hung step never returns: the test fails here, not forever
def test_hung_step_ends_its_episode_as_a_counted_failure(tokenizer, caplog: pytest.LogCaptureFixture) -> None:
    runner = _hanging_runner(tokenizer, "step", AgentConfig(max_turns=2, step_timeout_s=0.5))
    start = time.monotonic()
    episodes = runner.collect(ScriptedSampler(tokenizer, [WALLS]), [CORNER_SEED], 3, sample_seed=0)
    assert time.monotonic() - start < 10
    # samples 0 and 2: 2 turns × (Down −0.1, Left −0.1). Sample 1: its first "Left" hangs, so turn 1 keeps
    # "Down" (−0.1) and the episode ends there with that return: no penalty, the turn's tokens kept
    assert [ep.episode_return for ep in episodes] == pytest.approx([-0.4, -0.1, -0.4])
    hung = episodes[1]
    assert (hung.end_reason, hung.truncated, hung.terminated, hung.success) == (
        "env_timeout",
        True,
        False,
        False,
    )
    (turn,) = hung.turns
    assert turn.actions == ["Down"] and turn.actions_valid == [True] and turn.penalty == 0.0
    assert turn.sampled_ids == list(tokenizer.encode(WALLS, add_special_tokens=False))
    assert [ep.end_reason for ep in episodes[::2]] == ["max_turns", "max_turns"]
    assert RolloutStats.of(episodes).env_timeouts == 1.0
    # the group keeps its 3 rows: the filter and the advantages see a full group
    batch = collate_episodes(episodes, 1, tokenizer.pad_token_id)
    assert by_group(batch.returns, batch.group_index, 1).tolist() == [pytest.approx([-0.4, -0.1, -0.4])]
    assert batch.loss_mask[1].sum() == len(turn.sampled_ids)
    (record,) = [r for r in caplog.records if "step_timeout_s" in r.getMessage()]
    assert record.levelname == "WARNING"
    assert f"{SOKOBAN} seed {CORNER_SEED} (sample 1): env.step('Left') did not return" in record.getMessage()
    _check_hung_env_left_alone()


@pytest.mark.timeout(30)
def test_hung_reset_ends_its_episode_before_it_is_sampled(
    tokenizer, caplog: pytest.LogCaptureFixture
) -> None:
    # sample 1 of seed 3 sleeps in reset; the sleep is interrupted, the other three episodes play on
    runner = _hanging_runner(
        tokenizer, "reset", AgentConfig(max_turns=2, step_timeout_s=0.5), seed=3, how="sleep"
    )
    rec = Recorder(ScriptedSampler(tokenizer, [WALLS]))
    episodes = runner.collect(rec, [CORNER_SEED, 3], 2, sample_seed=0)
    hung = episodes[3]
    assert (hung.seed, hung.sample, hung.end_reason, hung.truncated) == (3, 1, "env_timeout", True)
    # one unsampled turn: the prompt it would have had (no observation), nothing to train on, return 0
    (turn,) = hung.turns
    assert turn.sampled_ids == [] and turn.observation == NO_OBSERVATION and hung.episode_return == 0.0
    assert hung.token_ids == turn.prompt_ids and NO_OBSERVATION in tokenizer.decode(turn.prompt_ids)
    assert turn.reasoning_ids is None and turn.penalty == 0.0
    assert [len(call.prompts) for call in rec.calls] == [3, 3]  # the sampler never saw it
    # seed 2: walls, −0.4; seed 3: Down, Left push the box, then Down (a wall) and Left onto the target:
    # −0.1 · 3 + (−0.1 + 1 + 10) = 10.6
    assert [ep.episode_return for ep in episodes] == pytest.approx([-0.4, -0.4, 10.6, 0.0])
    assert [ep.end_reason for ep in episodes[:3]] == ["max_turns", "max_turns", "terminated"]
    assert RolloutStats.of(episodes).env_timeouts == 1.0
    batch = collate_episodes(episodes, 2, tokenizer.pad_token_id)
    assert by_group(batch.returns, batch.group_index, 2).shape == (2, 2)
    assert batch.loss_mask[3].sum() == 0 and batch.attention_mask[3].sum() == len(turn.prompt_ids)
    assert any("env.reset did not return" in r.getMessage() for r in caplog.records)
    _check_hung_env_left_alone()


@pytest.mark.timeout(30)
def test_hung_solver_ends_its_episode_before_the_turn_is_sampled(tokenizer) -> None:
    # the scripted sampler asks the env's solver for each prompt's plan; sample 1's solver hangs
    runner = _hanging_runner(
        tokenizer, "oracle", AgentConfig(max_turns=3, max_actions_per_turn=2, step_timeout_s=0.5)
    )
    rec = Recorder(ScriptedSampler(tokenizer, ["Plan.</think><answer>{oracle}</answer>"]))
    episodes = runner.collect(rec, [CORNER_SEED], 3, sample_seed=0)
    # samples 0 and 2 solve seed 2 in one turn (2 moves at −0.1, box on target +1, solved +10)
    assert [ep.episode_return for ep in episodes] == pytest.approx([10.8, 0.0, 10.8])
    assert [ep.end_reason for ep in episodes] == ["terminated", "env_timeout", "terminated"]
    (turn,) = episodes[1].turns
    assert turn.sampled_ids == [] and turn.prompt_ids == episodes[0].turns[0].prompt_ids
    assert len(rec.calls[0].prompts) == 2
    _check_hung_env_left_alone()


@pytest.mark.timeout(30)
def test_hung_step_off_the_main_thread_is_bounded_too(tokenizer) -> None:
    # signals reach the main thread only: elsewhere the call runs in a worker thread that is stopped
    runner = _hanging_runner(tokenizer, "step", AgentConfig(max_turns=2, step_timeout_s=0.5))
    out: list[list[Episode]] = []
    thread = threading.Thread(
        target=lambda: out.append(runner.collect(ScriptedSampler(tokenizer, [WALLS]), [CORNER_SEED], 3, 0)),
        daemon=True,
    )
    thread.start()
    thread.join(20)
    assert not thread.is_alive(), "the collection hung"
    (episodes,) = out
    assert [ep.episode_return for ep in episodes] == pytest.approx([-0.4, -0.1, -0.4])
    assert [ep.end_reason for ep in episodes] == ["max_turns", "env_timeout", "max_turns"]
    # the abandoned call was stopped by its asynchronous exception: no spinning thread is left behind
    deadline = time.monotonic() + 5
    while any(t.name == "ragen2-env-call" for t in threading.enumerate()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(t.name == "ragen2-env-call" for t in threading.enumerate())
    _check_hung_env_left_alone()


def test_no_limit_and_a_bad_limit(tokenizer) -> None:
    for off in (None, 0):
        (ep,) = _run(tokenizer, [WALLS], cfg=AgentConfig(max_turns=1, step_timeout_s=off))
        assert ep.episode_return == pytest.approx(-0.2)
    for bad in (-1, float("nan"), float("inf"), "60", True):
        with pytest.raises(ValueError, match=r"env\.step_timeout_s=.*Fix: env\.step_timeout_s=60"):
            AgentConfig(step_timeout_s=bad)
