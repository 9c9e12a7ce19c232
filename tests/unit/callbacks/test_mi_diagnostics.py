"""The MI pass as a callback: when it runs, what it measures, logs and checkpoints, where the pass goes, and
the all-gather that makes every rank run the same pass."""

from __future__ import annotations

import io
import json
import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from helpers import trajectory_grid as grid
from hydra.utils import instantiate

from ragen2.callbacks import MIDiagnostics
from ragen2.config import compose
from ragen2.data import RolloutBatch
from ragen2.diagnostics.findings import Findings
from ragen2.diagnostics.mi_pass import CurvePass
from ragen2.diagnostics.regimes import PassMetrics
from ragen2.diagnostics.sampling import gather_trajectories
from ragen2.distributed import ONE_PROCESS, Ranks
from ragen2.errors import ConfigError

ALL = ["first_turn", "trajectory", "per_turn"]


@pytest.fixture(scope="module")
def batch() -> RolloutBatch:
    cfg = compose(["model=tiny", "rollout=scripted", "rollout.groups=4"])
    return instantiate(cfg.data).rollout(0)


def test_due_at_iteration_zero_and_every_n() -> None:
    assert [i for i in range(12) if MIDiagnostics(every_n_iterations=5).due(i)] == [0, 5, 10]
    assert not any(MIDiagnostics(enabled=False).due(i) for i in range(12))
    assert not any(MIDiagnostics(every_n_iterations=0).due(i) for i in range(12))


def test_columns_and_chance_per_mode(small_llama) -> None:
    # 4 groups × 2 rollouts × 3 turns, turn 1 without a valid Z: first-turn has no rows, and every other
    # row's X is its own rollout's history, so each row is its own column (chance 1/R, not 1/groups)
    callback = MIDiagnostics(modes=ALL, num_samples=64)
    out = callback.measure_trajectories(small_llama, grid(first_valid=False), iteration=0).as_metrics()
    assert out["diag/first_turn/valid_rows"] == 0 and "diag/first_turn/columns" not in out
    for curve in ("trajectory", "turn_2", "turn_3"):
        assert out[f"diag/{curve}/rows"] == out[f"diag/{curve}/columns"] == 8
        assert out[f"diag/{curve}/chance"] == out[f"diag/{curve}/retrieval_chance"] == 1 / 8
        assert out[f"diag/{curve}/mi_upper_bound"] == pytest.approx(math.log(8))
    # cost: Z's of one length and no X a prefix of another, so the scorer runs the bound less each
    # column's last prompt token (it feeds that token with the reasoning instead): tokens = bound − Σ C
    bound = out["diag/tokens_processed"] / out["diag/token_bound_ratio"]
    assert out["diag/tokens_processed"] == pytest.approx(bound - 3 * 8) and out["time/diagnostics"] > 0
    # with a valid turn 1, first-turn rows fall into the 4 groups' prompts
    out = MIDiagnostics(modes=ALL, num_samples=64).measure_trajectories(small_llama, grid(), 0).as_metrics()
    assert out["diag/first_turn/rows"] == 8 and out["diag/first_turn/columns"] == 4
    assert out["diag/first_turn/chance"] == 0.25
    assert out["diag/trajectory/rows"] == 8 and 4 <= out["diag/trajectory/columns"] <= 8


def test_budget_per_mode_and_per_turn(small_llama) -> None:
    callback = MIDiagnostics(modes=ALL, num_samples={"first_turn": 3, "trajectory": 5, "per_turn": 6})
    out = callback.measure_trajectories(small_llama, grid(), iteration=3).as_metrics()
    assert out["diag/first_turn/rows"] == 3 and out["diag/trajectory/rows"] == 5
    assert out["diag/turn_2/rows"] == out["diag/turn_3/rows"] == 6
    assert out["diag/turn_2/valid_rows"] == 8


def test_each_curve_has_its_own_ema_and_survives_a_checkpoint(small_llama) -> None:
    callback = MIDiagnostics(modes=ALL)
    callback.measure_trajectories(small_llama, grid(seed=1), iteration=0)
    state = callback.state_dict()
    assert sorted(state) == ["first_turn", "trajectory", "turn_2", "turn_3"]
    assert len({s["sigma_ema"] for s in state.values()}) == 4  # four EMAs, not one shared
    buffer = io.BytesIO()
    torch.save(state, buffer)  # Lightning loads checkpoints weights-only
    buffer.seek(0)
    resumed = MIDiagnostics(modes=ALL)
    resumed.load_state_dict(torch.load(buffer, weights_only=True))
    nxt = grid(seed=2)
    a = callback.measure_trajectories(small_llama, nxt, iteration=5).as_metrics()
    b = resumed.measure_trajectories(small_llama, nxt, iteration=5).as_metrics()
    assert {k: v for k, v in a.items() if k.startswith("diag/")} == {
        k: v for k, v in b.items() if k.startswith("diag/")
    }
    # the layout before the other modes: only first_turn's EMA; it carries on, the rest start fresh
    old = MIDiagnostics(modes=ALL)
    old.load_state_dict({"first_turn": state["first_turn"]})
    c = old.measure_trajectories(small_llama, nxt, iteration=5).as_metrics()
    assert c["diag/first_turn/mi_zscore_ema"] == a["diag/first_turn/mi_zscore_ema"]
    assert c["diag/trajectory/mi_zscore_ema"] == pytest.approx(c["diag/trajectory/mi_zscore"])
    assert c["diag/trajectory/mi_zscore_ema"] != a["diag/trajectory/mi_zscore_ema"]
    # first-turn only (the default) keeps exactly the old layout
    assert list(MIDiagnostics().state_dict()) == ["first_turn"]


def test_measure_on_a_real_batch(batch: RolloutBatch, tiny_model) -> None:
    callback = MIDiagnostics(num_samples=8)
    found = callback.measure(tiny_model, batch)
    out = found.as_metrics()
    assert found.iteration == batch.iteration and list(found.curves) == ["first_turn"]  # first-turn only
    assert 2 <= out["diag/first_turn/columns"] <= 4 and out["diag/first_turn/valid_rows"] >= 8
    for key in ("mi_est", "cond_entropy", "retrieval_acc", "retrieval_chance@2", "mi_zscore_ema"):
        assert f"diag/first_turn/{key}" in out
    assert out["diag/first_turn/retrieval_chance"] == pytest.approx(1 / out["diag/first_turn/columns"])
    # what the collapse monitor reads: the curve's logged numbers, as an object
    keys = ("cond_entropy", "contrast", "retrieval_above_chance")
    assert found.regime_input("first_turn") == PassMetrics(*(out[f"diag/first_turn/{k}"] for k in keys))
    assert found.regime_input("trajectory") is None  # a curve the pass lacks


def test_a_batch_with_one_prompt_has_no_mi(batch: RolloutBatch, tiny_model) -> None:
    one_group = batch.select(batch.group_index.eq(0).nonzero().squeeze(-1))
    found = MIDiagnostics().measure(tiny_model, one_group)
    out = found.as_metrics()
    assert sorted(out) == ["diag/first_turn/valid_rows", "diag/tokens_processed", "time/diagnostics"]
    assert out["diag/tokens_processed"] == 0
    assert found.curves == {"first_turn": CurvePass(valid_rows=out["diag/first_turn/valid_rows"])}
    assert found.regime_input("first_turn") is None  # a pass, but no curve to classify


def test_the_pass_goes_to_the_module_s_findings_not_the_batch(batch: RolloutBatch, tiny_model) -> None:
    module = SimpleNamespace(policy=tiny_model, findings=Findings())
    before = dict(batch.record.as_metrics())
    MIDiagnostics(num_samples=8).on_train_batch_start(None, module, batch, 0)  # type: ignore[arg-type]
    assert batch.record.as_metrics() == before
    assert module.findings.mi is not None and module.findings.mi.iteration == batch.iteration
    mi, gradients = module.findings.before_update(batch.iteration)
    assert mi is module.findings.mi and gradients is None
    logged = mi.as_metrics()
    assert logged["diag/first_turn/rows"] == 8 and "time/diagnostics" in logged
    assert module.findings.before_update(batch.iteration + 1) == (
        None,
        None,
    )  # the next iteration had no pass


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"modes": ["first_turn", "turns"]}, r"diagnostics\.modes=\['first_turn', 'turns'\] .*Fix"),
        ({"modes": []}, r"diagnostics\.modes=\[\] .*Fix"),
        ({"modes": "trajectory"}, r"diagnostics\.modes=trajectory .*Fix"),
        ({"num_samples": 1}, r"diagnostics\.num_samples=1: .*Fix: diagnostics\.num_samples=64"),
        (
            {"modes": ALL, "num_samples": {"first_turn": 8, "trajectory": 8}},
            r"diagnostics\.num_samples=.*no budget for modes \['per_turn'\].*Fix",
        ),
        ({"num_samples": {"first_turn": 8, "turn_2": 8}}, r"unknown modes \['turn_2'\].*Fix"),
        ({"num_samples": {"first_turn": 1}}, r"diagnostics\.num_samples\.first_turn=1: .*Fix"),
    ],
)
def test_bad_settings_name_the_key_and_the_fix(kwargs: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        MIDiagnostics(**kwargs)


def test_paper_settings_compose() -> None:
    cfg = compose(["diagnostics=paper"]).diagnostics
    callback = MIDiagnostics(**{k: v for k, v in cfg.items() if k != "_target_"})
    assert callback.modes == tuple(ALL) and callback.every_n_iterations == 5
    assert callback.budgets == dict.fromkeys(ALL, 64)
    assert compose([]).diagnostics.modes == ["first_turn"]


def _rank(rank: int, world: int, store: str, out: str) -> None:
    """One of two gloo processes: its own share of episodes, the gathered pass, its numbers to a file."""
    import torch.distributed as dist
    from transformers import LlamaConfig, LlamaForCausalLM

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    try:
        torch.set_num_threads(1)  # two processes on a small machine
        torch.manual_seed(0)  # the same weights on every rank, as DDP keeps them
        model = LlamaForCausalLM(
            LlamaConfig(
                vocab_size=128,
                hidden_size=32,
                num_attention_heads=2,
                num_key_value_heads=2,
                intermediate_size=64,
                num_hidden_layers=1,
            )
        ).eval()
        local = grid(groups=2, seed=10 + rank)  # each rank rolled out different groups
        gathered = gather_trajectories(local, Ranks.current())
        found = MIDiagnostics(modes=ALL, num_samples=6).measure_trajectories(model, gathered, iteration=5)
        measured = found.as_metrics()
        measured.pop("time/diagnostics")
        Path(out).write_text(json.dumps({"gathered": gathered, "metrics": measured}))
    finally:
        dist.destroy_process_group()


def test_two_processes_gather_and_log_the_same_numbers(tmp_path: Path) -> None:
    outs = [str(tmp_path / f"rank{r}.json") for r in range(2)]
    torch.multiprocessing.spawn(_ranks, args=(str(tmp_path / "store"), outs), nprocs=2, join=True)
    results = [json.loads(Path(o).read_text()) for o in outs]
    whole = grid(groups=2, seed=10) + grid(groups=2, seed=11)  # rank 0's share, then rank 1's
    as_lists = json.loads(json.dumps(whole))
    assert results[0]["gathered"] == results[1]["gathered"] == as_lists
    assert results[0]["metrics"] == results[1]["metrics"]
    assert results[0]["metrics"]["diag/first_turn/columns"] == 4  # both ranks' groups are columns
    assert results[0]["metrics"]["diag/turn_2/valid_rows"] == 8  # 2 ranks × 2 groups × 2 rollouts
    assert gather_trajectories(whole, ONE_PROCESS) == whole  # one process: nothing gathered, nothing changed


def _ranks(rank: int, store: str, outs: list[str]) -> None:
    _rank(rank, 2, store, outs[rank])


def test_the_heldout_curve_reads_the_first_turns_of_the_same_held_out_instances_every_pass(
    batch: RolloutBatch, tiny_model
) -> None:
    from ragen2.data.evaluation import heldout_seeds

    cfg = compose(["model=tiny", "rollout=scripted", "rollout.groups=4"])
    source = instantiate(cfg.data)
    asked: list[tuple[list[int], int, int]] = []

    class Recorded:  # the real DataModule's first turns, and what was asked of it
        def first_turns(self, seeds, samples, sample_seed):
            asked.append((list(seeds), samples, sample_seed))
            return source.first_turns(seeds, samples, sample_seed)

    callback = MIDiagnostics(num_samples=8, seed=3, heldout={"num_seeds": 5, "samples": 2})
    found = [callback.measure(tiny_model, batch, Recorded()) for _ in range(2)]
    assert asked == [(heldout_seeds(3, 5), 2, 3)] * 2  # validation's first instances, one sampler seed
    out = found[0].as_metrics()
    # every first turn with a valid Z is a row (the scripted responses leave some <think> unclosed)
    episodes = source.first_turns(heldout_seeds(3, 5), 2, 3)
    valid = [ep.turns[0] for ep in episodes if ep.turns[0].reasoning_ids]
    assert len(episodes) == 10 and 2 <= len(valid) < 10
    assert out["diag/heldout/rows"] == out["diag/heldout/valid_rows"] == len(valid)
    columns = len({tuple(t.prompt_ids) for t in valid})
    assert out["diag/heldout/columns"] == columns and out["diag/heldout/chance"] == 1 / columns
    assert out["diag/heldout/mi_upper_bound"] == pytest.approx(math.log(columns))
    # the batch's curve is the pass it would be without the held-out one
    alone = MIDiagnostics(num_samples=8, seed=3).measure(tiny_model, batch).as_metrics()
    assert {k: v for k, v in alone.items() if k.startswith("diag/first_turn/")} == {
        k: v for k, v in out.items() if k.startswith("diag/first_turn/")
    }
    # the same rows both times (same instances, same draw, same weights): only the EMA moves on
    second = found[1].as_metrics()
    assert second["diag/heldout/mi_est"] == out["diag/heldout/mi_est"]
    assert callback.state_dict().keys() == {"first_turn", "heldout"}
    # without a source (a notebook passing only the batch) there is no held-out curve
    assert "heldout" not in MIDiagnostics(heldout={"num_seeds": 5}).measure(tiny_model, batch).curves


@pytest.mark.parametrize("world", [1, 2, 3, 7])
def test_the_held_out_instances_are_shared_out_in_rank_order(world: int) -> None:
    from ragen2.callbacks.diagnostics import HeldOut
    from ragen2.data.evaluation import heldout_seeds

    held = HeldOut(num_seeds=5)
    shares = [held.seeds(held.all_seeds(2, None), Ranks(rank, world)) for rank in range(world)]
    assert [s for share in shares for s in share] == heldout_seeds(2, 5)


@pytest.mark.parametrize(
    ("heldout", "message"),
    [
        ({"num_seeds": 1}, r"diagnostics\.heldout\.num_seeds=1: .*Fix: diagnostics\.heldout\.num_seeds=16"),
        (
            {"num_seeds": 4, "samples": 0},
            r"diagnostics\.heldout\.samples=0 .*Fix: diagnostics\.heldout\.samples=4",
        ),
        ({"num_seeds": "16"}, r"diagnostics\.heldout\.num_seeds"),
        ({"seeds": 16}, r"diagnostics\.heldout\.seeds"),
    ],
)
def test_bad_heldout_settings_name_the_key_and_the_fix(heldout: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        MIDiagnostics(heldout=heldout)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"exact": {"num_prompts": 1}},
            r"diagnostics\.exact\.num_prompts=1: .*Fix: diagnostics\.exact\.num_prompts=64",
        ),
        ({"exact": {"prompts": 64}}, r"diagnostics\.exact\.prompts"),
        ({"columns": [4, 1]}, r"diagnostics\.columns=\[4, 1\] .*Fix: diagnostics\.columns=\[4,16\]"),
        ({"columns": "4"}, r"diagnostics\.columns='4'"),
    ],
)
def test_bad_exact_and_columns_settings_name_the_key_and_the_fix(kwargs: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        MIDiagnostics(**kwargs)


class _Prompts:
    """A data module's ``RendersPrompts``: seed s renders [s] with reset info {"kind": even/odd}."""

    def __init__(self, grammar: list[list[int]] | None) -> None:
        self.grammar = grammar

    def first_prompts(self, seeds):
        return [([7, int(s) % 50], {"kind": "even" if s % 2 == 0 else "odd"}) for s in seeds]

    def grammar_ids(self):
        return self.grammar


def test_held_out_instances_are_chosen_by_their_reset_info() -> None:
    from ragen2.callbacks.diagnostics import matching_seeds
    from ragen2.data.evaluation import heldout_seeds

    every = heldout_seeds(3, 40)
    odd = matching_seeds(3, 5, {"kind": "odd"}, _Prompts(None), "diagnostics.exact")
    assert odd == [s for s in every if s % 2][:5]
    assert matching_seeds(3, 5, None, None, "diagnostics.exact") == every[:5]
    with pytest.raises(
        ConfigError, match=r"diagnostics\.exact\.info=\{'kind': 'none'\}: only 0 of the first 500"
    ):
        matching_seeds(3, 5, {"kind": "none"}, _Prompts(None), "diagnostics.exact")


def test_the_exact_figures_need_an_env_with_a_grammar(small_llama, batch: RolloutBatch) -> None:
    callback = MIDiagnostics(exact={"num_prompts": 4, "info": {"kind": "even"}})
    with pytest.raises(ConfigError, match=r"diagnostics\.exact .*has none\. Fix: env=twohop"):
        callback.grammar(_Prompts(None))
    # with one, the pass logs diag/exact/* over the 4 even held-out prompts and the grammar's 3 sentences
    out = MIDiagnostics(exact={"num_prompts": 4, "info": {"kind": "even"}})
    found = out.measure_trajectories(small_llama, [], 0, grammar=out.grammar(_Prompts([[1, 2], [3], [1, 4]])))
    metrics = found.as_metrics()
    assert metrics["diag/exact/prompts"] == 4 and metrics["diag/exact/sentences"] == 3
    assert 0 <= metrics["diag/exact/mi"] <= math.log(3) + 1e-9
    assert 0 < metrics["diag/exact/grammar_mass"] <= 1
