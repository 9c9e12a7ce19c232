"""Gradients by reward-variance bucket on the tiny model: zero task gradient where rewards do not vary,
task norms that follow RV, the KL term against an independent computation, nothing of the run touched."""

from __future__ import annotations

import csv
import random
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import episode, turn
from hydra.utils import instantiate

from ragen2.callbacks import GradientBuckets
from ragen2.config import compose
from ragen2.data.batch import RolloutBatch, collate_episodes
from ragen2.errors import ConfigError
from ragen2.modules import PolicyModule

K = 4  # samples per group
RESPONSES = [[1000 + 7 * k, 2000 + 3 * k, 3000 + k, 4000 + 5 * k, 5000] for k in range(K)]


def make_module(tmp_path: Path, *overrides: str) -> PolicyModule:
    module = instantiate(compose(["model=tiny", *overrides], run_dir=str(tmp_path)).module)
    module.configure_model()
    return module


def make_batch(returns: Sequence[Sequence[float]], shared_prompt: bool = False) -> RolloutBatch:
    """One group per row of ``returns`` (K samples each): sample k of every group samples RESPONSES[k];
    the prompt is shared by all groups or the group's own."""
    episodes = []
    for g, rewards in enumerate(returns):
        prompt = [11, 12, 13, 14] if shared_prompt else [11, 12 + g, 13 + 2 * g, 14]
        episodes += [
            episode(g, [turn(prompt, RESPONSES[k], reward=r)], sample=k) for k, r in enumerate(rewards)
        ]
    return collate_episodes(episodes, num_groups=len(returns), pad_id=0)


def test_zero_variance_bucket_has_exactly_zero_task_gradient_under_grpo(tmp_path: Path) -> None:
    module = make_module(tmp_path, "algo=grpo")
    # 6 groups, 3 buckets of 2: groups 2, 4, 5 never vary (all fail, all succeed, all penalised); by group
    # id the first two fill q1, the third shares q2 with the lowest varying group (0: RV 1/16)
    returns = [[0.5 * (g + 1) * r for r in (1.0, 0.0, 0.0, 0.0)] for g in range(6)]
    returns[2], returns[4], returns[5] = [0.0] * K, [1.0] * K, [-0.1] * K
    out = (
        GradientBuckets(every_n_iterations=1, num_buckets=3).measure(module, make_batch(returns)).as_metrics()
    )
    assert out["grad/q1/rv_max"] == 0.0 and out["grad/q2/rv_min"] == 0.0 and out["grad/q2/rv_max"] > 0
    # advantages (R − mean)/(std + ε) are exactly 0 in a constant group: −A·ratio has a zero gradient
    assert out["grad/q1/task"] == 0.0 and out["grad/q1/task_per_token"] == 0.0
    assert out["grad/q2/task"] > 0 and out["grad/all/task"] > 0
    # the regulariser still pushes where the task is silent
    assert out["grad/q1/entropy"] > 0
    assert "grad/q1/kl" not in out  # no KL term in the loss: no reference model, no number
    assert [out[f"grad/{b}/groups"] for b in ("q1", "q2", "q3", "all")] == [2, 2, 2, 6]
    assert out["grad/all/samples"] == 6 * K and out["grad/all/tokens"] == 6 * K * len(RESPONSES[0])


def test_task_norm_follows_reward_variance_and_entropy_stays_flat(tmp_path: Path) -> None:
    # Dr.GRPO, A = R − mean_g: group g returns s_g·(1, 0, 0, 0) on the same prompt and responses, so its
    # task gradient is s_g·v for one v (ratio 1, on-policy): the norm is proportional to s_g (RV = s_g²/4),
    # and the entropy term, blind to rewards, is the same in every bucket
    module = make_module(tmp_path, "algo=drgrpo")
    scale = [3.0, 0.0, 5.0, 1.0, 4.0, 2.0]  # by group id: q1 … q6 hold s = 0, 1, 2, 3, 4, 5
    batch = make_batch([[s * r for r in (1.0, 0.0, 0.0, 0.0)] for s in scale], shared_prompt=True)
    found = GradientBuckets(every_n_iterations=1).measure(module, batch)
    out = found.as_metrics()
    task = [b.norms["task"].norm for b in found.buckets]
    rv = [b.rv_mean for b in found.buckets]
    assert [b.name for b in found.buckets] == [f"q{b}" for b in range(1, 7)]
    assert rv == sorted(rv) and task == sorted(task) and task[0] == 0.0
    torch.testing.assert_close(torch.tensor(task) / task[1], torch.arange(6.0), rtol=1e-5, atol=0)
    # all: Σ_b W_b·∇L_b / W_all with W = 4 samples per bucket: (0 + 1 + … + 5)·4·v / 24 = 2.5·v
    assert out["grad/all/task"] == pytest.approx(2.5 * task[1], rel=1e-5)
    # a sequence mean: per sample is the plain norm; per token divides ‖∇S‖ = 4·norm by 4 rows × 5 tokens
    assert out["grad/q2/task_per_sample"] == pytest.approx(task[1])
    assert out["grad/q2/task_per_token"] == pytest.approx(task[1] * 4 / 20)
    entropy = torch.tensor([out[f"grad/q{b}/entropy"] for b in range(1, 7)])
    assert entropy.min() > 0
    torch.testing.assert_close(entropy, entropy[0].expand(6), rtol=1e-6, atol=0)


def _kl_grad_norm(module: PolicyModule, batch: RolloutBatch, rows: torch.Tensor) -> float:
    """kl_coef · token-mean k3(π‖π_ref) over ``rows``, from the models' own logits: the norm of its gradient."""
    ids, attention, mask = batch.input_ids[rows], batch.attention_mask[rows], batch.loss_mask[rows, 1:]

    def logp(model: torch.nn.Module) -> torch.Tensor:
        logits = model(input_ids=ids, attention_mask=attention).logits[:, :-1].float() / module.temperature
        return torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None]).squeeze(-1)

    with torch.no_grad():
        ref = logp(module.ref_policy)
    log_r = ref - logp(module.policy)  # k3 = r − log r − 1 with r = π_ref/π (no clamp reached here)
    loss = module.algo.kl_coef * ((log_r.exp() - log_r - 1.0) * mask).sum() / mask.sum()
    params = [p for p in module.policy.parameters() if p.requires_grad]
    grads = torch.autograd.grad(loss, params, allow_unused=True)
    return float(torch.linalg.vector_norm(torch.stack([g.norm() for g in grads if g is not None])))


def test_kl_gradient_of_a_perturbed_policy_matches_an_independent_computation_and_nothing_moves(
    tmp_path: Path,
) -> None:
    module = make_module(tmp_path, "algo=grpo", "algo.kl_coef=0.1", "algo.kl_kind=low_var_kl")
    params = [p for p in module.policy.parameters() if p.requires_grad]
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():  # π ≠ π_ref: at π = π_ref the k3 gradient is 0 and would prove nothing
        for p in params:
            p.add_(0.05 * torch.randn(p.shape, generator=gen))
    for p in params[::2]:  # some parameters hold a gradient from the last step, others none
        p.grad = torch.randn(p.shape, generator=gen)
    held = [(p.grad, None if p.grad is None else p.grad.clone()) for p in params]
    weights = [p.detach().clone() for p in params]
    random.seed(5)
    np.random.seed(5)
    torch.manual_seed(5)
    states = (random.getstate(), np.random.get_state()[1].copy(), torch.get_rng_state())
    returns = [[s * r for r in (1.0, 0.0, 1.0, 0.0)] for s in (0.0, 2.0, 1.0)]  # q1 = group 0, q3 = group 1
    batch = make_batch(returns)
    out = GradientBuckets(every_n_iterations=1, num_buckets=3).measure(module, batch).as_metrics()
    # parameters, their gradients (the same tensors) and every random state as they were
    assert all(torch.equal(p, w) for p, w in zip(params, weights))
    for p, (obj, value) in zip(params, held):
        assert p.grad is obj and (value is None or torch.equal(p.grad, value))
    assert random.getstate() == states[0]
    assert np.array_equal(np.random.get_state()[1], states[1])
    assert torch.equal(torch.get_rng_state(), states[2])
    # the KL term: one bucket and all of them, against the models' own logits
    for p in params:
        p.grad = None
    assert out["grad/q1/kl"] > 1e-4 and out["grad/q1/task"] == 0.0 and out["grad/q3/task"] > 0
    assert out["grad/q1/kl"] == pytest.approx(_kl_grad_norm(module, batch, torch.arange(K)), rel=1e-4)
    assert out["grad/all/kl"] == pytest.approx(_kl_grad_norm(module, batch, torch.arange(3 * K)), rel=1e-4)


@pytest.mark.parametrize(
    ("key", "value"), [("every_n_iterations", -1), ("every_n_iterations", 2.5), ("num_buckets", 0)]
)
def test_bad_settings_name_the_key_and_the_fix(key: str, value: object) -> None:
    with pytest.raises(ConfigError, match=rf"callbacks\.gradient_buckets\.{key}=.*Fix: "):
        GradientBuckets(**{key: value})
    assert not GradientBuckets(every_n_iterations=0).due(0)
    assert [GradientBuckets(every_n_iterations=2).due(i) for i in range(4)] == [True, False, True, False]


def _train_rows(run_dir: Path) -> list[dict[str, str]]:
    with (run_dir / "csv" / "metrics.csv").open() as f:
        return [r for r in csv.DictReader(f) if r.get("train/iteration")]


@pytest.mark.slow
def test_a_run_with_the_pass_on_trains_exactly_as_with_it_off(tmp_path: Path) -> None:
    from ragen2.train import run

    common = [
        "model=tiny",
        "rollout=scripted",
        "iterations=2",
        "algo.optim.lr=1e-3",
        "algo.kl_coef=0.05",
        "diagnostics.enabled=false",
        "trainer.limit_val_batches=0",
        "callbacks.curves=null",
    ]
    rows = {}
    for every in (0, 1):
        run_dir = tmp_path / f"every_{every}"
        cfg = compose(
            [*common, f"callbacks.gradient_buckets.every_n_iterations={every}"], run_dir=str(run_dir)
        )
        run(cfg)
        rows[every] = _train_rows(run_dir)
    off, on = rows[0], rows[1]
    assert len(off) == len(on) == 2
    for a, b in zip(off, on):
        compared = [k for k in a if k.startswith(("train/", "rollout/", "filter/")) and a[k] != ""]
        assert compared and {k: a[k] for k in compared} == {k: b[k] for k in compared}
        assert "grad/all/task" in b and b["grad/q1/kl"] != "" and a.get("grad/all/task", "") == ""
    assert sorted(p.name for p in (tmp_path / "every_1" / "gradients").iterdir()) == [
        "iteration_00000.png",
        "iteration_00001.png",
    ]
