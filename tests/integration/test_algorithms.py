"""Every algorithm config runs a real iteration: the paper's main table (docs/method.md §6) and the rest.

The tiny model with the scripted sampler (oracle, wrong and malformed responses) gives differently
rewarded groups, so every cell has signal; each must take an optimizer step that moves the weights.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from ragen2.models.loading import load_model

MAIN_TABLE = [(algo, flt) for algo in ("ppo", "dapo", "grpo", "drgrpo") for flt in ("top_p", "none")]
OTHERS = ["rloo", "reinforce_pp", "reinforce_pp_baseline", "gspo"]


def _state(run_dir: Path) -> dict[str, torch.Tensor]:
    return torch.load(run_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)[
        "state_dict"
    ]


def _changed(state: dict[str, torch.Tensor], prefix: str, init: dict[str, torch.Tensor]) -> list[str]:
    return [
        k for k, v in state.items() if k.startswith(prefix) and not torch.equal(v, init[k[len(prefix) :]])
    ]


def _assert_real_update(metrics: dict[str, float], run_dir: Path) -> dict[str, torch.Tensor]:
    assert metrics["filter/kept"] >= 1 and metrics["train/optimizer_steps"] >= 1
    assert metrics["train/grad_norm"] > 0
    state = _state(run_dir)
    assert _changed(state, "policy.", load_model("tiny").state_dict()), "no policy parameter changed"
    return state


@pytest.mark.slow
@pytest.mark.parametrize(("algo", "flt"), MAIN_TABLE, ids=[f"{a}-{f}" for a, f in MAIN_TABLE])
def test_main_table_cell_runs_a_real_update(algo: str, flt: str, train) -> None:
    metrics, cfg = train(["iterations=1", f"algo={algo}", f"filter={flt}"], name=f"{algo}-{flt}")
    state = _assert_real_update(metrics, Path(cfg.run_dir))
    assert metrics["rollout/return_std"] > 0
    if flt == "none":
        assert metrics["filter/kept_ratio"] == 1.0
    if algo == "ppo":  # the value head on the shared trunk learned too
        assert metrics["train/critic/grad_norm"] > 0 and metrics["train/critic/value_loss"] > 0
        assert any(
            not torch.equal(v, torch.zeros_like(v)) for k, v in state.items() if k.startswith("critic.head.")
        )
    if algo == "dapo":  # dynamic sampling filled the batch with groups that carry signal
        assert metrics["filter/dynamic_groups_kept"] == cfg.rollout.groups
        assert metrics["filter/dynamic_shortfall"] == 0


@pytest.mark.slow
@pytest.mark.parametrize("algo", OTHERS)
def test_other_algorithms_run_a_real_update(algo: str, train) -> None:
    metrics, cfg = train(["iterations=1", f"algo={algo}"], name=algo)
    _assert_real_update(metrics, Path(cfg.run_dir))


def test_ppo_critic_warmup_trains_only_a_separate_critic_with_kl_in_reward(train) -> None:
    metrics, cfg = train(
        [
            "iterations=1",
            "algo=ppo",
            "algo/critic=separate",
            "algo.critic.warmup_iterations=1",
            "algo/kl_reward=adaptive",
        ],
        name="ppo-warmup",
    )
    state = _state(Path(cfg.run_dir))
    init = load_model("tiny").state_dict()
    assert not _changed(state, "policy.", init), "the policy moved during the critic warm-up"
    assert metrics["train/critic/warmup"] == 1.0 and metrics["train/grad_norm"] == 0.0
    assert metrics["train/critic/grad_norm"] > 0
    # the separate critic's own trunk (a copy of the policy's weights) and head both learned
    init_trunk = {k.removeprefix("model."): v for k, v in init.items() if k.startswith("model.")}
    assert _changed(state, "critic.trunk.", init_trunk), "the separate critic's trunk did not learn"
    # the reference model ran: KL in the reward is logged with the controller's coefficient
    assert metrics["train/kl_reward/coef"] == pytest.approx(cfg.algo.kl_reward.controller.init_kl_coef)
    assert "train/kl_reward/kl" in metrics


@pytest.mark.slow
@pytest.mark.parametrize("algo", ["grpo", "drgrpo", "gspo", "ppo"])
def test_micro_batching_does_not_change_the_gradient(algo: str, train) -> None:
    # One row per micro-batch vs the whole mini-batch in one: the share weighting must make the accumulated
    # gradient the same for every aggregation (token-mean, seq-mean-token-sum-norm, seq-mean-token-mean)
    # and for the value loss. Adam's first step hides gradient scale, so compare the pre-clip norm.
    base = ["iterations=1", f"algo={algo}", "filter=none", "algo.mini_batch_size=16"]
    whole, _ = train([*base, "algo.max_tokens_per_micro_batch=1000000"], name="whole")
    split, _ = train([*base, "algo.max_tokens_per_micro_batch=1"], name="split")
    for key in ("train/grad_norm", "train/loss", "train/pg_loss"):
        assert split[key] == pytest.approx(whole[key], rel=1e-4, abs=1e-7), key
    assert split["train/optimizer_steps"] == whole["train/optimizer_steps"] == 1


@pytest.mark.slow
def test_loss_scaling_scales_advantages_by_the_kept_ratio(train) -> None:
    # the same seeds give the same batch and the same kept groups; only the advantages' scale differs
    plain, _ = train(["iterations=1", "algo.loss_scaling=none"], name="plain")
    ratio = plain["filter/kept_ratio"]
    assert 0 < ratio < 1
    for scaling, power in (("linear", 1.0), ("sqrt", 0.5)):
        scaled, _ = train(["iterations=1", f"algo.loss_scaling={scaling}"], name=scaling)
        assert scaled["train/advantage_abs"] == pytest.approx(
            plain["train/advantage_abs"] * ratio**power, rel=1e-5
        ), scaling


@pytest.mark.slow
def test_logged_loss_terms_sum_to_the_loss(train) -> None:
    # PPO with a KL term in the loss: every term is present; each is logged scaled as the optimizer sees it
    overrides = [
        "iterations=1",
        "algo=ppo",
        "algo.kl_coef=0.05",
        "algo.entropy_coef=0.01",
        "algo.mini_batch_size=4",
    ]
    metrics, cfg = train(overrides, name="terms")
    terms = ("train/pg_loss", "train/entropy_loss", "train/kl_loss", "train/value_loss")
    # float32 sums, in an order the CPU's kernels and threads choose: their error scales with the terms, not
    # with the loss, which is smaller when they cancel (on a 2-core AVX-512 Xeon, 1.4e-8 apart: 1.1e-6 of that
    # loss, 7e-8 of the terms' magnitudes). The smallest term, the KL's, is thousands of times the tolerance.
    scale = sum(abs(metrics[k]) for k in terms)
    assert metrics["train/loss"] == pytest.approx(sum(metrics[k] for k in terms), rel=0, abs=1e-6 * scale)
    assert metrics["train/entropy_loss"] == pytest.approx(-0.01 * metrics["train/entropy"], rel=1e-6)
    assert metrics["train/kl_loss"] == pytest.approx(0.05 * metrics["train/kl"], rel=1e-6, abs=1e-12)
    assert metrics["train/value_loss"] == pytest.approx(
        cfg.algo.critic.vf_coef * metrics["train/critic/value_loss"], rel=1e-6
    )
    assert metrics["train/kl"] > 0  # the second mini-batch's policy has moved off the reference


@pytest.mark.parametrize("algo", ["grpo", "ppo"])
def test_sharing_the_prompt_pass_does_not_change_the_update(algo: str, train, monkeypatch) -> None:
    # A group's rows share their prompt: run once (with gradients) under algo.share_prompt_prefix, the
    # loss, its gradient and the critic's values (PPO reads the same hidden states) equal the plain pass's.
    from ragen2.models import forward

    calls = []
    for name in ("packed_prefix_hidden", "shared_prefix_hidden"):
        shared_pass = getattr(forward, name)
        monkeypatch.setattr(forward, name, lambda *a, run=shared_pass: calls.append(1) or run(*a))
    base = ["iterations=1", f"algo={algo}", "filter=none", "algo.mini_batch_size=16"]
    plain, _ = train(base, name="plain")
    assert not calls
    shared, _ = train([*base, "algo.share_prompt_prefix=true"], name="shared")
    assert calls  # the prompts were in fact shared
    keys = ["train/grad_norm", "train/loss", "train/pg_loss", "train/entropy"]
    keys += ["train/critic/value_loss", "train/critic/vpred_mean"] if algo == "ppo" else []
    for key in keys:
        assert shared[key] == pytest.approx(plain[key], rel=1e-4, abs=1e-6), key
