"""Two real iterations of the loop: rollouts, filter, diagnostics, update, logs, checkpoint, resume."""

from __future__ import annotations

import csv
import logging
from pathlib import Path

import pytest
import torch

from integration.conftest import CURVES

NAMESPACES = ("rollout/", "filter/", "diag/", "train/", "time/")


def _policy_weights(ckpt: Path) -> dict[str, torch.Tensor]:
    state = torch.load(ckpt, map_location="cpu", weights_only=False)["state_dict"]
    return {k: v for k, v in state.items() if k.startswith("policy.")}


def _metric_rows(run_dir: Path) -> list[dict[str, str]]:
    with (run_dir / "csv" / "metrics.csv").open() as f:
        return list(csv.DictReader(f))


def test_two_iterations_update_the_policy_through_the_task_gradient(train, tmp_path: Path) -> None:
    from ragen2.models.loading import load_model

    _, cfg = train(["iterations=2", "rollout.save_jsonl=true"])
    run_dir = Path(cfg.run_dir)
    # a kept group and a real update at every iteration
    rows = [r for r in _metric_rows(run_dir) if r.get("train/iteration")]
    assert len(rows) == 2
    for r in rows:
        assert float(r["filter/kept"]) >= 1 and float(r["train/optimizer_steps"]) >= 1
        # entropy_coef = 0 and no KL: the only loss term is the clipped surrogate (the task gradient)
        assert float(r["train/grad_norm"]) > 0 and float(r["train/pg_loss"]) != 0.0
    # differently rewarded episodes: the scripted oracle solves some, others take wrong or malformed turns
    assert float(rows[0]["rollout/return_std"]) > 0
    header = rows[0].keys()
    for ns in NAMESPACES:
        assert any(k.startswith(ns) for k in header), f"no {ns}* metric logged"
    for key in (
        "diag/first_turn/mi_est",
        "diag/first_turn/retrieval_acc",
        "rollout/format_valid_rate",
        "filter/kept_ratio",
        "filter/score_cv",
        "train/clipfrac_high",
    ):
        assert key in header
    # the weights moved away from the initial tiny model
    before = {f"policy.{k}": v for k, v in load_model("tiny").state_dict().items()}
    after = _policy_weights(run_dir / "checkpoints" / "last.ckpt")
    changed = [k for k, v in after.items() if not torch.equal(v, before[k])]
    assert changed, "no parameter changed"
    # artifacts: rollout tables and every episode as JSONL
    assert (run_dir / "rollouts" / "iteration_00001.md").is_file()
    lines = (run_dir / "rollouts.rank0.jsonl").read_text().splitlines()
    assert len(lines) == 2 * 4 * 4


def test_iteration_with_nothing_kept_performs_no_update_and_the_stop_fails_the_run(
    train, tmp_path: Path
) -> None:
    from ragen2.modules.policy import RunStopped

    # one canned response: every rollout of a group earns the same return, every group scores
    # reward std 0, and top_p (include_zero false) keeps nothing; two such iterations stop the run of three
    with pytest.raises(
        RunStopped,
        match=r"^algo\.max_empty_iterations=2: the filter kept no group in 2 iterations in a row \(iterations "
        r"0–1: .*\), so the run stopped after iteration 1\. Fix: .*algo\.max_empty_iterations=0",
    ) as stopped:
        train(
            [
                "iterations=3",
                "rollout.sampler.responses=['plan</think><answer>Left</answer>']",
                "algo.max_empty_iterations=2",
            ]
        )
    assert "\n" not in str(stopped.value)
    run_dir = tmp_path / "run"  # its files are written before the error
    rows = [r for r in _metric_rows(run_dir) if r.get("train/iteration")]
    assert [float(r["filter/skipped"]) for r in rows] == [1.0, 1.0]
    assert all(r.get("train/optimizer_steps", "") == "" for r in rows)
    weights = _policy_weights(run_dir / "checkpoints" / "last.ckpt")
    from ragen2.models.loading import load_model

    init = load_model("tiny").state_dict()
    assert all(torch.equal(v, init[k[len("policy.") :]]) for k, v in weights.items())


@pytest.mark.slow
@pytest.mark.parametrize(
    "algo",
    [["algo=grpo"], ["algo=ppo", "algo/kl_reward=adaptive"], ["algo=dapo"]],
    ids=["grpo", "ppo-kl_reward", "dapo"],
)
def test_resume_from_last_ckpt_equals_running_on(algo: list[str], train, tmp_path: Path) -> None:
    straight, cfg_a = train(["iterations=2", *algo], name="straight")
    _, cfg_b = train(["iterations=1", *algo], name="first")
    ckpt = Path(cfg_b.run_dir) / "checkpoints" / "last.ckpt"
    resumed, cfg_c = train(["iterations=2", f"ckpt_path={ckpt}", *algo], name="resumed")
    # every trained tensor (the policy and, for PPO, the critic) ends bit-identical
    a = torch.load(Path(cfg_a.run_dir) / "checkpoints" / "last.ckpt", weights_only=False)
    c = torch.load(Path(cfg_c.run_dir) / "checkpoints" / "last.ckpt", weights_only=False)
    assert a["state_dict"].keys() == c["state_dict"].keys()
    for k, v in a["state_dict"].items():  # tensors, and the MI metric's EMA (its extra state, a dict)
        assert (
            torch.equal(v, c["state_dict"][k]) if isinstance(v, torch.Tensor) else v == c["state_dict"][k]
        ), k
    assert a["ragen2"]["kl_reward_coef"] == c["ragen2"]["kl_reward_coef"]
    assert not any(k.startswith("ref_policy.") for k in a["state_dict"])  # rebuilt from the base model
    # the resumed iteration rolled out and trained on exactly what the uninterrupted one did
    keys = ["rollout/return", "filter/kept", "train/loss", "train/grad_norm", "diag/first_turn/mi_est"]
    keys += [
        k
        for k in ("train/critic/value_loss", "train/kl_reward/coef", "filter/dynamic_rounds")
        if k in straight
    ]
    for key in keys:
        assert resumed[key] == straight[key], key


def test_wandb_offline_files_and_curves_png(train, tmp_path: Path) -> None:
    _, cfg = train(["iterations=1", "logger=wandb", CURVES])
    run_dir = Path(cfg.run_dir)
    offline = list((run_dir / "wandb").glob("offline-run-*/run-*.wandb"))
    assert offline and offline[0].stat().st_size > 0
    png = run_dir / "curves.png"
    assert png.is_file() and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_perf_counts_every_sampled_and_every_trained_token(train, tmp_path: Path) -> None:
    import json

    _, cfg = train(["iterations=1", "filter=none", "algo.epochs=2", "rollout.save_jsonl=true"])
    run_dir = Path(cfg.run_dir)
    (row,) = [r for r in _metric_rows(run_dir) if r.get("train/iteration")]
    records = [json.loads(line) for line in (run_dir / "rollouts.rank0.jsonl").read_text().splitlines()]
    sampled = sum(len(t["sampled_ids"]) for r in records for t in r["turns"])
    assert float(row["perf/rollout_tokens"]) == sampled > 0
    # filter=none trains every episode, each forwarded once per epoch at its full length
    episodes = len(records)
    assert float(row["perf/update_tokens"]) == pytest.approx(
        2 * episodes * float(row["rollout/sequence_length"]), rel=1e-6
    )
    for phase in ("rollout", "update"):
        rate = float(row[f"perf/{phase}_tokens_per_s"]) * float(row[f"time/{phase}"])
        assert rate == pytest.approx(float(row[f"perf/{phase}_tokens"]), rel=1e-6)
        assert f"perf/{phase}_peak_memory_gb" not in row  # CUDA only


# the objective of conf/algo (the clipped surrogate), NaN on the chosen micro-batches (tests/poisoned.py);
# one micro-batch per optimizer step, so the n-th call is the n-th step
POISONED = ("algo.policy_loss._target_=poisoned.PoisonedLoss", "algo.max_tokens_per_micro_batch=1000000")


def test_a_non_finite_step_is_skipped_counted_shown_and_never_saved(train, caplog) -> None:
    from ragen2.models.loading import load_model

    with caplog.at_level(logging.INFO, logger="ragen2"):
        _, cfg = train(["iterations=2", "filter=none", *POISONED, "+algo.policy_loss.calls=[0]"])
    run_dir = Path(cfg.run_dir)
    rows = [r for r in _metric_rows(run_dir) if r.get("train/iteration")]
    # 16 rows in mini-batches of 8: two steps an iteration, the very first one NaN
    assert [(r["train/optimizer_steps"], r["train/nonfinite_steps"]) for r in rows] == [
        ("1.0", "1.0"),
        ("2.0", "0.0"),
    ]
    assert all(float(r["train/grad_norm"]) > 0 for r in rows)  # the finite steps' norms, no NaN among them
    summaries = [m for m in caplog.messages if m.startswith("iteration ") and "| steps " in m]
    assert "| nonfinite 1 |" in summaries[0] and "nonfinite" not in summaries[1]
    weights = _policy_weights(run_dir / "checkpoints" / "last.ckpt")
    assert all(bool(torch.isfinite(v).all()) for v in weights.values())
    init = load_model("tiny").state_dict()
    assert any(not torch.equal(v, init[k[len("policy.") :]]) for k, v in weights.items())  # training went on


def test_max_nonfinite_steps_in_a_row_stop_with_an_error_and_the_last_finite_checkpoint(
    train, tmp_path: Path
) -> None:
    from ragen2.models.loading import load_model

    # one step an iteration, every one NaN: iterations 0 and 1 are skipped and saved, iteration 2 stops
    overrides = [
        "iterations=4",
        "filter=none",
        "algo.mini_batch_size=16",
        *POISONED,
        "+algo.policy_loss.calls=[0,1,2,3]",
    ]
    with pytest.raises(
        RuntimeError, match=r"^iteration 2: 3 optimizer steps in a row had a non-finite"
    ) as err:
        train(overrides)
    assert "algo.max_nonfinite_steps=3" in str(err.value) and "Fix:" in str(err.value)
    run_dir = tmp_path / "run"  # the fixture's run folder
    ckpt = torch.load(run_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    assert ckpt["epoch"] == 1 and ckpt["ragen2"]["nonfinite_streak"] == 2
    init = load_model("tiny").state_dict()
    weights = {k: v for k, v in ckpt["state_dict"].items() if k.startswith("policy.")}
    assert all(torch.equal(v, init[k[len("policy.") :]]) for k, v in weights.items())  # never stepped


def test_groups_by_outcome_and_the_effective_reward_are_logged_and_shown(train, caplog) -> None:
    import json
    import statistics

    # filter=none trains on every group, those without reward variance too: their rows get no advantage
    with caplog.at_level(logging.INFO, logger="ragen2"):
        _, cfg = train(["iterations=2", "filter=none", "rollout.save_jsonl=true"])
    run_dir = Path(cfg.run_dir)
    rows = [r for r in _metric_rows(run_dir) if r.get("train/iteration")]
    episodes = [json.loads(line) for line in (run_dir / "rollouts.rank0.jsonl").read_text().splitlines()]
    summaries = [m for m in caplog.messages if m.startswith("iteration ")]
    for it, row in enumerate(rows):
        groups: dict[int, list[dict]] = {}
        for ep in episodes:
            if ep["iteration"] == it:
                groups.setdefault(ep["group"], []).append(ep)
        wins = [sum(ep["success"] for ep in g) for g in groups.values()]
        assert float(row["rollout/groups"]) == len(groups) == 4
        assert float(row["rollout/groups_all_success"]) == sum(w == 4 for w in wins) / 4
        assert float(row["rollout/groups_all_fail"]) == sum(w == 0 for w in wins) / 4
        assert float(row["rollout/groups_mixed"]) == sum(0 < w < 4 for w in wins) / 4
        # GRPO: a rollout has an advantage iff its return is off its group's mean
        effective = [
            ep["return"]
            for g in groups.values()
            for ep in g
            if ep["return"] != statistics.fmean(e["return"] for e in g)
        ]
        assert float(row["train/effective_rows"]) == len(effective)
        assert float(row["train/effective_reward"]) == pytest.approx(statistics.fmean(effective), abs=1e-6)
        shown = f"all_ok {float(row['rollout/groups_all_success']):.2f} | all_fail "
        assert (
            shown in summaries[it]
            and f"| eff_reward {float(row['train/effective_reward']):+.2f} |" in summaries[it]
        )


def test_the_heldout_curve_scores_fixed_held_out_instances_and_changes_nothing_else(train) -> None:
    import math

    # 4 held-out instances × 2 first turns at every pass; the run's own numbers are those of a run without it
    plain, _ = train(["iterations=1"], name="plain")
    probed, cfg = train(["iterations=1", "diagnostics.heldout.num_seeds=4", "diagnostics.heldout.samples=2"])
    heldout = {k for k in probed if k.startswith("diag/heldout/")}
    assert heldout and not any(k.startswith("diag/heldout/") for k in plain)
    cost = ("time/", "perf/", "diag/tokens_processed", "diag/token_bound_ratio")  # the pass runs more
    assert {k: v for k, v in probed.items() if k not in heldout and not k.startswith(cost)} == {
        k: v for k, v in plain.items() if not k.startswith(cost)
    }
    assert probed["diag/tokens_processed"] > plain["diag/tokens_processed"]
    columns = probed["diag/heldout/columns"]  # the instances with a valid Z among their first turns
    assert 2 <= columns <= 4 and probed["diag/heldout/rows"] == probed["diag/heldout/valid_rows"] <= 8
    assert probed["diag/heldout/mi_upper_bound"] == pytest.approx(math.log(columns))
    logged = [r for r in _metric_rows(Path(cfg.run_dir)) if r.get("diag/heldout/rows")]
    assert [float(r["diag/heldout/rows"]) for r in logged] == [probed["diag/heldout/rows"]]
