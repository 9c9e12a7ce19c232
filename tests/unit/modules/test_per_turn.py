"""One sequence per turn (``rollout.layout=per_turn``): a row that packs its turns' sequences runs each on its own
context, and where a turn's context is the earlier turns verbatim the per-turn row gives the single sequence's
log-probs and loss. The tiny model, CPU, plain torch."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from helpers import episode, turn

from ragen2.agent.episode import Episode
from ragen2.config import build, compose
from ragen2.data.batch import collate_episodes
from ragen2.models.forward import decoder_hidden
from ragen2.models.loading import load_model
from ragen2.modules.algo_config import AlgoConfig
from ragen2.modules.update import Update
from ragen2.settings import settings

PROMPT = [11, 12, 13, 14, 15]
CLOSER_AND_USER = [7, 8, 9]  # what the template adds between an assistant turn and the next prompt
# each group's episodes: (turn-1 reply, turn-2 reply, return on turn 2)
REPLIES = [
    [([101, 102], [103, 104, 105], 1.0), ([111, 112, 113], [114], 0.0)],
    [([121], [122, 123], 0.0), ([131, 132], [133, 134, 135, 136], 1.0)],
]


def make_algo(*overrides: str) -> AlgoConfig:
    cfg = compose(["model=tiny", "algo=grpo", "algo.entropy_coef=0.01", *overrides])
    return settings(AlgoConfig, build(cfg.algo, _convert_="all"), "algo")


def two_turn(group: int, sample: int, first: list[int], second: list[int], reward: float) -> Episode:
    """Turn 2's prompt is turn 1's sequence, the template's ids between turns and the next user message."""
    prompt = [*PROMPT, 20 + group]
    return episode(
        group,
        [turn(prompt, first, penalty=-0.1), turn([*prompt, *first, *CLOSER_AND_USER], second, reward=reward)],
        sample=sample,
    )


def per_turn(ep: Episode, rewrite: bool = False) -> Episode:
    """The same turns, each a sequence of its own in the row; ``rewrite``: turn 2's context drops turn 1's
    reply (as a template dropping earlier reasoning would)."""
    first, second = ep.turns
    prompt = [*first.prompt_ids, *CLOSER_AND_USER] if rewrite else second.prompt_ids
    packed = dataclasses.replace(second, prompt_ids=prompt, offset=first.end)
    return dataclasses.replace(ep, turns=[first, packed])


def episodes() -> list[Episode]:
    return [two_turn(g, k, a, b, r) for g, group in enumerate(REPLIES) for k, (a, b, r) in enumerate(group)]


def test_a_packed_row_runs_each_sequence_on_its_own_context() -> None:
    torch.manual_seed(0)
    model = load_model("tiny").eval()
    a, b = torch.randint(3, 500, (7,)), torch.randint(3, 500, (9,))
    row = torch.cat([a, b, torch.zeros(2, dtype=torch.long)])[None]  # two sequences and padding
    index = torch.tensor([[1] * 7 + [2] * 9 + [0] * 2])
    with torch.no_grad():
        packed = decoder_hidden(model, row, (index > 0).long(), sequence_index=index)[0]
        alone = [decoder_hidden(model, s[None], torch.ones(1, len(s), dtype=torch.long))[0] for s in (a, b)]
        whole = decoder_hidden(model, row[:, :16], torch.ones(1, 16, dtype=torch.long))[0]
    torch.testing.assert_close(packed[:7], alone[0])
    torch.testing.assert_close(packed[7:16], alone[1])
    assert not torch.allclose(packed[7:16], whole[7:16], atol=1e-4)  # b alone, not after a
    assert torch.equal(packed[16:], torch.zeros_like(packed[16:]))


def test_the_row_lays_out_each_turn_after_the_last() -> None:
    ep = per_turn(episodes()[0])
    first, second = ep.turns
    assert ep.sequences == [(0, first.end), (first.end, second.end)]
    assert ep.token_ids == [*first.prompt_ids, *first.sampled_ids, *second.prompt_ids, *second.sampled_ids]
    batch = collate_episodes([ep], num_groups=1, pad_id=0)
    sampled = batch.input_ids[0][batch.loss_mask[0].bool()].tolist()
    assert sampled == [*first.sampled_ids, *second.sampled_ids]
    assert batch.sequence_index[0].tolist() == [1] * first.end + [2] * (second.end - first.end)
    assert collate_episodes(episodes()[:1], 1, 0).sequence_index[0].unique().tolist() == [1]


# seq-mean-token-sum-norm without algo.loss_norm divides by the row's width, which packing lengthens: it
# differs by construction; the others read only the loss-masked tokens of each row
@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
def test_per_turn_rows_give_the_single_sequence_s_loss_where_both_apply(agg: str) -> None:
    torch.manual_seed(0)
    policy = load_model("tiny")
    update = Update(make_algo(f"algo.loss_agg={agg}"), policy)
    single = collate_episodes(episodes(), num_groups=2, pad_id=0)
    packed = collate_episodes([per_turn(ep) for ep in episodes()], num_groups=2, pad_id=0)
    rows = torch.arange(4)
    results = []
    for batch in (single, packed):
        inputs = update.prepare(batch, rows, on_policy=rows, kl_reward=None)
        terms, old = update.loss_terms(inputs, rows)
        assert terms.policy is not None and terms.entropy is not None
        sampled = old[batch.loss_mask.bool()]  # the sampled tokens' log-probs, row by row in order
        results.append((terms.policy + terms.entropy, sampled))
    (loss_s, logp_s), (loss_p, logp_p) = results
    torch.testing.assert_close(logp_p, logp_s, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(loss_p, loss_s, rtol=1e-5, atol=1e-6)
    assert packed.input_ids.shape[1] > single.input_ids.shape[1]


def test_a_rewritten_turn_trains_on_the_context_it_was_given() -> None:
    """Turn 2's context without turn 1's reply: its tokens' log-probs are the model's given that context."""
    torch.manual_seed(0)
    policy = load_model("tiny")
    update = Update(make_algo(), policy)
    ep = per_turn(episodes()[0], rewrite=True)
    batch = collate_episodes([ep], num_groups=1, pad_id=0)
    _, logp, _ = update._forward(policy, batch)
    second = ep.turns[1]
    alone = torch.tensor([[*second.prompt_ids, *second.sampled_ids]])
    with torch.no_grad():
        logits = policy(input_ids=alone).logits[0, :-1].float()
    want = (
        torch.log_softmax(logits, -1).gather(-1, alone[0, 1:, None]).squeeze(-1)[-len(second.sampled_ids) :]
    )
    torch.testing.assert_close(logp[0, second.start : second.end].detach(), want, rtol=1e-5, atol=1e-5)
