"""The update without a Trainer: ``prepare``, ``plan``, a pure ``loss_terms`` against hand-derived numbers,
and ``run`` skipping a non-finite step (weights and optimizer state untouched, the streak counted and
carried, the error after ``algo.max_nonfinite_steps`` in a row). The tiny model, CPU, plain torch."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import pytest
import torch
from helpers import episode, turn
from hydra.utils import instantiate
from poisoned import PoisonedLoss

from ragen2.config import build, compose
from ragen2.data.batch import KeptShare, RolloutBatch, collate_episodes
from ragen2.models.loading import load_model
from ragen2.modules.algo_config import AlgoConfig
from ragen2.modules.run_state import RunState
from ragen2.modules.update import NonFiniteUpdate, Update, UpdateStats, build_optimizer
from ragen2.settings import settings

PROMPT = [11, 12, 13, 14]
# group 0 returns (1, 0, 0, 0) with responses of 2, 3, 3, 3 tokens; group 1 (0, 1, 1, 0) with 3 tokens each
RETURNS = [[1.0, 0.0, 0.0, 0.0], [0.0, 1.0, 1.0, 0.0]]
LENGTHS = [[2, 3, 3, 3], [3, 3, 3, 3]]


def make_batch() -> RolloutBatch:
    episodes = [
        episode(g, [turn([*PROMPT, 20 + g], [100 + 10 * k + t for t in range(n)], reward=r)], sample=k)
        for g, (rewards, lengths) in enumerate(zip(RETURNS, LENGTHS))
        for k, (r, n) in enumerate(zip(rewards, lengths))
    ]
    return collate_episodes(episodes, num_groups=2, pad_id=0)


def make_algo(*overrides: str) -> AlgoConfig:
    cfg = compose(["model=tiny", "algo=grpo", "algo.entropy_coef=0.0", *overrides])
    return settings(AlgoConfig, build(cfg.algo, _convert_="all"), "algo")


def poisoned(algo: AlgoConfig, calls: Sequence[int]) -> AlgoConfig:
    """``algo`` whose objective is NaN (loss and gradient) on the ``calls``-th micro-batches."""
    return dataclasses.replace(algo, policy_loss=PoisonedLoss(algo.policy_loss.fn, calls))


def own_logp(model: torch.nn.Module, batch: RolloutBatch, rows: torch.Tensor) -> torch.Tensor:
    """[b, T] log-probs of the sampled tokens from the model's own logits (0 off the loss mask)."""
    ids, attention, mask = batch.input_ids[rows], batch.attention_mask[rows], batch.loss_mask[rows]
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=attention).logits[:, :-1].float()
    out = torch.zeros_like(mask)
    out[:, 1:] = torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None]).squeeze(-1) * mask[:, 1:]
    return out


def test_plan_splits_each_minibatch_under_the_token_budget() -> None:
    update = Update(make_algo("algo.max_tokens_per_micro_batch=18"), policy=None)
    batch = make_batch()  # every row: 5 prompt tokens + its response, so 7 (row 0) or 8 tokens
    (whole, halves) = (
        update.plan(batch, [torch.arange(8)]),
        update.plan(batch, [torch.arange(4), torch.arange(4, 8)]),
    )
    # rows × longest ≤ 18: (0, 1) is 2 × 8 = 16, a third row would make 24; and so on in pairs
    assert [m.tolist() for m in whole[0].micro] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert [[m.tolist() for m in s.micro] for s in halves] == [[[0, 1], [2, 3]], [[4, 5], [6, 7]]]
    assert [s.padding for s in (*whole, *halves)] == [0, 0, 0]  # one process: nobody to wait for


def test_prepare_leaves_the_first_steps_rows_to_their_forward_and_scores_the_others() -> None:
    torch.manual_seed(0)
    policy = load_model("tiny")
    update = Update(make_algo(), policy)
    batch = make_batch()
    rows = torch.arange(8)
    inputs = update.prepare(batch, rows, on_policy=torch.tensor([0, 5]), kl_reward=None)
    assert inputs.known.tolist() == [False, True, True, True, True, False, True, True]
    others = torch.tensor([1, 2, 3, 4, 6, 7])
    torch.testing.assert_close(inputs.old_logp[others], own_logp(policy, batch, others), rtol=1e-5, atol=1e-5)
    assert not inputs.old_logp[torch.tensor([0, 5])].any()
    # GRPO, (R − mean) / (std + 1e-6), std Bessel-corrected: group 0 mean 1/4, std 1/2 → 1.5, −0.5 × 3;
    # group 1 mean 1/2, std √(1/3) → ∓√3/2; on every sampled token, 0 elsewhere
    s = 3**0.5 / 2
    expected = torch.tensor([1.5, -0.5, -0.5, -0.5, -s, s, s, -s])
    row_adv = inputs.advantages.sum(-1) / batch.loss_mask.sum(-1)
    torch.testing.assert_close(row_adv, expected, rtol=1e-5, atol=0)
    assert bool(((inputs.advantages != 0) == batch.loss_mask.bool()).all())


def test_loss_terms_writes_nothing_and_returns_the_old_log_probs_it_used() -> None:
    torch.manual_seed(0)
    policy = load_model("tiny")
    update = Update(make_algo(), policy)
    batch = make_batch()
    inputs = update.prepare(batch, torch.arange(8), on_policy=torch.arange(8), kl_reward=None)
    held = (inputs.old_logp.clone(), inputs.known.clone())
    rows = torch.arange(8)
    terms, old_logp = update.loss_terms(inputs, rows)
    assert torch.equal(inputs.old_logp, held[0]) and torch.equal(inputs.known, held[1])
    # on-policy: the old log-probs are this forward's own, so every ratio is 1 and nothing clips
    torch.testing.assert_close(old_logp, own_logp(policy, batch, rows), rtol=1e-5, atol=1e-5)
    assert terms.stats["clipfrac"] == 0.0
    # token-mean of −A · 1: group 0 gives 1.5·2 − 0.5·3·3 = −1.5, group 1 gives 0 (equal lengths and
    # ΣA = 0), over 2 + 3·3 + 4·3 = 23 tokens: −(−1.5)/23
    assert terms.policy is not None
    assert float(terms.policy.detach()) == pytest.approx(1.5 / 23, rel=1e-5)
    inputs.remember(rows, old_logp)
    assert inputs.known.all() and torch.equal(inputs.old_logp, old_logp)


def _state(optimizer: torch.optim.Optimizer) -> list[dict[str, torch.Tensor]]:
    return [{k: v.clone() for k, v in s.items()} for s in optimizer.state.values()]


def test_a_non_finite_step_is_skipped_with_weights_and_optimizer_untouched_and_training_goes_on() -> None:
    torch.manual_seed(0)
    policy = load_model("tiny")
    # one mini-batch of 8 rows in one micro-batch: one step per iteration; the second is poisoned
    update = Update(poisoned(make_algo("algo.optim.lr=1e-3", "algo.mini_batch_size=8"), [1]), policy)
    optimizer, scheduler = build_optimizer(update.algo, policy, None)
    state = RunState()

    def iteration(n: int) -> UpdateStats:
        batch = dataclasses.replace(make_batch(), iteration=n)
        return update.run(batch, optimizer, scheduler, torch.Tensor.backward, state)

    first = iteration(0)
    assert (first.steps, first.nonfinite) == (1, 0)
    weights = [p.detach().clone() for p in policy.parameters()]
    moments, lr_step = _state(optimizer), scheduler.last_epoch
    skipped = iteration(1)
    assert (skipped.steps, skipped.nonfinite) == (0, 1)
    assert state.nonfinite_streak == 1
    assert all(torch.equal(p, w) for p, w in zip(policy.parameters(), weights))
    after = _state(optimizer)
    assert all(torch.equal(a[k], b[k]) for a, b in zip(after, moments) for k in a)
    assert scheduler.last_epoch == lr_step and all(p.grad is None for p in policy.parameters())
    assert "loss" not in skipped.terms and "grad_norm" not in skipped.terms  # no NaN averaged in
    went_on = iteration(2)
    assert (went_on.steps, went_on.nonfinite) == (1, 0)
    assert state.nonfinite_streak == 0
    assert any(not torch.equal(p, w) for p, w in zip(policy.parameters(), weights))
    assert all(bool(torch.isfinite(p).all()) for p in policy.parameters())


def test_the_streak_carries_across_iterations_and_a_resume_and_stops_at_the_limit() -> None:
    torch.manual_seed(0)
    policy = load_model("tiny")
    algo = poisoned(make_algo("algo.mini_batch_size=8", "algo.max_nonfinite_steps=3"), [0, 1, 2])
    update = Update(algo, policy)
    optimizer, scheduler = build_optimizer(algo, policy, None)
    state = RunState()
    for n in (0, 1):
        update.run(
            dataclasses.replace(make_batch(), iteration=n), optimizer, scheduler, torch.Tensor.backward, state
        )
    assert state.nonfinite_streak == 2
    resumed = RunState()
    resumed.load_state_dict(state.state_dict())  # the checkpoint's run state
    assert resumed.nonfinite_streak == 2
    with pytest.raises(NonFiniteUpdate) as err:
        update.run(
            dataclasses.replace(make_batch(), iteration=2),
            optimizer,
            scheduler,
            torch.Tensor.backward,
            resumed,
        )
    message = str(err.value)
    assert message.startswith("iteration 2: 3 optimizer steps in a row had a non-finite loss or gradient")
    for part in ("algo.max_nonfinite_steps=3", "algo.optim.lr=", "fp16", "degenerate batch", "Fix:"):
        assert part in message
    assert not optimizer.state  # no step was ever taken


def test_the_kept_share_travels_on_the_batch_and_scales_the_advantages() -> None:
    # the DataModule counts the kept rows over every rank once and hands the count on with the batch
    datamodule = instantiate(compose(["model=tiny", "rollout=scripted"]).data)
    rolled = datamodule.rollout(0)
    assert rolled.share == KeptShare(0, int(rolled.kept_rows.numel()), 16)
    assert rolled.record.as_metrics()["filter/kept_row_ratio"] == rolled.share.ratio
    # the update reads it rather than counting again: this rank's 8 rows, all kept, are half of an
    # iteration of 16 (another rank's 8 kept none), so algo.loss_scaling=linear halves every advantage
    torch.manual_seed(0)
    policy = load_model("tiny")
    update = Update(make_algo("algo.loss_scaling=linear", "algo.mini_batch_size=8"), policy)
    optimizer, scheduler = build_optimizer(update.algo, policy, None)
    half = dataclasses.replace(make_batch(), share=KeptShare(first=0, kept=8, rows=16))
    out = update.run(half, optimizer, scheduler, torch.Tensor.backward, RunState())
    # mean |A| over sampled tokens (the advantages above): (1.5·2 + 0.5·9 + (√3/2)·12) / 23, then × 1/2
    assert out.advantage.abs == pytest.approx((7.5 + 3**0.5 / 2 * 12) / 23 / 2, rel=1e-5)


def test_the_effective_reward_is_the_mean_return_of_rows_with_an_advantage() -> None:
    # group 0 returns (1, 0, 0, 0): mean 0.25, every row off it; group 1 (0, 1, 0.5, 0.5): mean 0.5, so
    # its last two rows get no GRPO advantage. Effective rows 4 + 2 = 6, their mean return
    # (1 + 0 + 0 + 0 + 0 + 1)/6 = 1/3 (the plain mean over the 8 rows would be 3/8)
    returns = [[1.0, 0.0, 0.0, 0.0], [0.0, 1.0, 0.5, 0.5]]
    episodes = [
        episode(g, [turn([*PROMPT, 20 + g], [100 + 10 * k, 101 + 10 * k], reward=r)], sample=k)
        for g, rewards in enumerate(returns)
        for k, r in enumerate(rewards)
    ]
    batch = collate_episodes(episodes, num_groups=2, pad_id=0)
    torch.manual_seed(0)
    policy = load_model("tiny")
    update = Update(make_algo("algo.mini_batch_size=8"), policy)
    optimizer, scheduler = build_optimizer(update.algo, policy, None)
    out = update.run(batch, optimizer, scheduler, torch.Tensor.backward, RunState())
    assert out.advantage.effective_rows == 6
    assert out.advantage.effective_reward == pytest.approx(1 / 3)
    # no row with an advantage (every return equal): no effective reward to report
    flat = dataclasses.replace(
        batch, returns=torch.zeros(8), token_rewards=torch.zeros_like(batch.token_rewards)
    )
    out = update.run(flat, optimizer, scheduler, torch.Tensor.backward, RunState())
    assert out.advantage.effective_rows == 0 and out.advantage.effective_reward is None
    assert "train/effective_reward" not in out.as_metrics()


def test_the_sampler_s_log_probs_stand_for_the_old_ones_without_a_forward() -> None:
    # algo.old_logprobs=sampler: every row's old log-probs are the batch's sampler log-probs (the helpers' turns
    # record −0.5 a token), all known up front, and the scoring forward never runs
    policy = load_model("tiny")
    calls: list[int] = []
    hook = policy.get_decoder().register_forward_hook(lambda *_: calls.append(1))
    update = Update(make_algo("algo.old_logprobs=sampler"), policy)
    batch = make_batch()
    inputs = update.prepare(batch, torch.arange(8), on_policy=torch.tensor([0, 5]), kl_reward=None)
    hook.remove()
    assert calls == [] and bool(inputs.known.all())
    torch.testing.assert_close(inputs.old_logp, -0.5 * batch.loss_mask)
    # a token the sampler gave no log-prob (NaN) is refused, naming the setting and the fix
    nan = dataclasses.replace(batch, sampler_logprobs=torch.full_like(batch.sampler_logprobs, float("nan")))
    with pytest.raises(ValueError, match=r"algo\.old_logprobs=sampler.*Fix: algo\.old_logprobs=recompute"):
        update.prepare(nan, torch.arange(8), on_policy=torch.tensor([0]), kl_reward=None)


def test_an_unknown_source_of_old_log_probs_is_refused() -> None:
    from ragen2.errors import ConfigError

    with pytest.raises(ConfigError, match=r"algo\.old_logprobs='vllm' is unknown"):
        make_algo("algo.old_logprobs=vllm")


@pytest.mark.parametrize("coef", ["1.0", "-2.5"])
def test_an_entropy_bonus_out_of_range_is_refused(coef: str) -> None:
    from ragen2.errors import ConfigError

    with pytest.raises(
        ConfigError, match=rf"algo\.entropy_coef={coef} is out of range\. Fix: algo\.entropy_coef a number in"
    ):
        make_algo(f"algo.entropy_coef={coef}")


def test_whole_kept_groups_make_the_blocks_of_group_mini_batches() -> None:
    from ragen2.distributed import ONE_PROCESS
    from ragen2.modules.update import _group_block

    batch = make_batch()  # 2 groups × 4 rows, both kept
    assert _group_block(batch, batch.kept_rows, ONE_PROCESS) == 4
    # a trajectory-level choice keeping 3 rows of one group and 4 of the other: rows, not blocks
    uneven = dataclasses.replace(batch, keep_rows=torch.tensor([True] * 7 + [False]))
    assert _group_block(uneven, uneven.kept_rows, ONE_PROCESS) == 1
    assert make_algo("algo.minibatch=groups").minibatch == "groups"
