"""CollapseMonitor: its config errors, what it logs and warns on a metric stream, and real tiny runs that
warn, stop, and resume with its state from the checkpoint."""

from __future__ import annotations

import csv
import json
import logging
import subprocess
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path

import pytest
import torch

from ragen2.callbacks import CollapseMonitor
from ragen2.config import build, compose
from ragen2.diagnostics.mi_pass import CurvePass, MIPass
from ragen2.diagnostics.regimes import KEYS, PassMetrics, Regime, RegimeState, RegimeThresholds, classify
from ragen2.errors import ConfigError

STATE_KEY = "CollapseMonitor{'mode': 'first_turn'}"
FAST = (
    "model=tiny",
    "rollout=scripted",
    "algo.optim.lr=1e-3",
    "trainer.limit_val_batches=0",
    "callbacks.rollout_table=null",
    "callbacks.curves=null",
)
# mi_fraction = 1: the contrast is low when ≤ max(first pass's, 0), which the first pass itself always is;
# H(Z|X) > 0 stays above half of itself. So the first pass is template collapse, declared at once with
# patience 1: a deterministic alarm at iteration 0 whatever the random model's numbers.
ALARM_AT_FIRST_PASS = ("callbacks.collapse.patience=1", "callbacks.collapse.mi_fraction=1")


@contextmanager
def records() -> Iterator[list[logging.LogRecord]]:
    """Every record of the ``ragen2`` logger while the block runs."""
    out: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = out.append  # type: ignore[method-assign]
    logger = logging.getLogger("ragen2")
    logger.addHandler(handler)
    try:
        yield out
    finally:
        logger.removeHandler(handler)


def warnings_of(logged: list[logging.LogRecord]) -> list[str]:
    return [r.getMessage() for r in logged if r.levelno == logging.WARNING]


def metric_rows(run_dir: str) -> list[dict[str, str]]:
    with (Path(run_dir) / "csv" / "metrics.csv").open() as f:
        return [r for r in csv.DictReader(f) if r.get("train/iteration")]


def saved_state(run_dir: str) -> RegimeState:
    ckpt = torch.load(Path(run_dir) / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    return RegimeState.from_dict(ckpt["callbacks"][STATE_KEY])


def pass_of(row: dict[str, str]) -> PassMetrics:
    """The first-turn curve's regime numbers as the CSV logger wrote them (float32)."""
    return PassMetrics(*(float(row[f"diag/first_turn/{key}"]) for key in KEYS))


def train(run_dir: Path, overrides: Sequence[str]) -> tuple[dict[str, float], list[logging.LogRecord]]:
    from ragen2.train import run

    with records() as logged:
        metrics = run(compose([*FAST, *overrides], run_dir=str(run_dir)))
    return metrics, logged


# ---- config --------------------------------------------------------------------------------------


def test_on_by_default_warning_on_the_first_turn_curve() -> None:
    monitor = build(compose([]).callbacks.collapse)
    assert isinstance(monitor, CollapseMonitor)
    assert (monitor.mode, monitor.on_collapse) == ("first_turn", "warn")
    assert monitor.thresholds == RegimeThresholds()


@pytest.mark.parametrize(
    ("override", "named"),
    [
        ("on_collapse=halt", "callbacks.collapse.on_collapse='halt'"),
        ("mode=per_turn", "callbacks.collapse.mode='per_turn'"),
        ("mode=turn_1", "callbacks.collapse.mode='turn_1'"),
        ("patience=0", "callbacks.collapse.patience=0"),
        ("entropy_fraction=2", "callbacks.collapse.entropy_fraction=2"),
    ],
)
def test_bad_values_are_config_errors_naming_key_value_and_fix(override: str, named: str) -> None:
    cfg = compose([f"callbacks.collapse.{override}"])
    with pytest.raises(ConfigError) as err:
        build(cfg.callbacks.collapse)
    key = named.split("=")[0]
    assert str(err.value).startswith(named) and f"Fix: {key}=" in str(err.value)


def test_a_curve_of_another_mode_is_accepted() -> None:
    assert CollapseMonitor(mode="turn_12").state_key == "CollapseMonitor{'mode': 'turn_12'}"
    assert CollapseMonitor(mode="trajectory").mode == "trajectory"


# ---- a constructed stream of MI passes through the callback ---------------------------------------


def _pass(iteration: int, h: float, c: float, r: float, curve: str = "first_turn") -> MIPass:
    proxies = {"cond_entropy": h, "contrast": c, "retrieval_above_chance": r}
    return MIPass(iteration, {curve: CurvePass(8, 8, 4, proxies)})


def metrics_of(reading: object) -> dict[str, float]:
    return {} if reading is None else reading.as_metrics()  # type: ignore[attr-defined]


def test_stream_logs_regimes_on_passes_and_warns_once_with_the_evidence() -> None:
    monitor = CollapseMonitor(patience=2)
    stream = [
        _pass(0, 2.0, 1.0, 0.4),  # 0: the first pass, the reference
        _pass(0, 2.0, 1.0, 0.4),  # 1: no pass this iteration (the latest is iteration 0's)
        _pass(2, 1.9, 0.1, 0.0),  # 2: template (1st)
        _pass(3, 1.9, 0.2, 0.05),  # 3: template (2nd): declared, the alarm
        _pass(4, 1.9, 0.9, 0.35),  # 4: healthy (1st)
        _pass(5, 1.9, 0.9, 0.35),  # 5: healthy (2nd): recovered
        _pass(6, 1.9, 0.1, 0.0),  # 6
        _pass(7, 1.9, 0.1, 0.0),  # 7: template again: no second warning
        _pass(8, 2.0, 1.0, 0.4, curve="trajectory"),  # 8: another curve's pass: not this monitor's
        None,  # 9: a run without an MI callback
    ]
    with records() as logged:
        out = [metrics_of(monitor.observe(mi, iteration)) for iteration, mi in enumerate(stream)]
    assert [o.get("diag/regime") for o in out] == [0.0, None, 0.0, 1.0, 1.0, 0.0, 0.0, 1.0, None, None]
    assert [o.get("diag/regime_raw") for o in out] == [0.0, None, 1.0, 1.0, 0.0, 0.0, 1.0, 1.0, None, None]
    (warning,) = warnings_of(logged)
    assert warning.startswith("template collapse at iteration 3 (first_turn MI pass 3, patience 2)")
    assert "while H(Z|X) holds" in warning
    assert "contrast 0.2 nats/token vs 1 at the first pass (low: threshold 0.5)" in warning
    assert "retrieval above chance 0.05 vs 0.4 at the first pass (reported, not a vote)" in warning
    changes = [r.getMessage() for r in logged if r.levelno == logging.INFO]
    assert changes == [
        "regime at iteration 5: template collapse → healthy",
        "regime at iteration 7: healthy → template collapse",
    ]
    assert monitor.state.passes == 7 and monitor.state.first == PassMetrics(2.0, 1.0, 0.4)


def test_state_dict_round_trip_continues_the_stream() -> None:
    monitor = CollapseMonitor(patience=2)
    for iteration, mi in enumerate((_pass(0, 2.0, 1.0, 0.4), _pass(1, 1.9, 0.1, 0.0))):
        monitor.observe(mi, iteration)
    resumed = CollapseMonitor(patience=2)
    resumed.load_state_dict(monitor.state_dict())
    assert resumed.state == monitor.state and resumed.state.mi_streak == 1
    # the second template pass completes the streak begun before the checkpoint
    assert metrics_of(resumed.observe(_pass(2, 1.9, 0.1, 0.0), 2))["diag/regime"] == float(
        Regime.TEMPLATE_COLLAPSE
    )


def test_a_checkpoint_with_the_z_score_reference_restarts_the_reference() -> None:
    old = {  # the state the monitor saved when its MI axis read mi_zscore_ema
        "first": {"cond_entropy": 2.0, "mi_zscore_ema": 1.0, "retrieval_above_chance": 0.4},
        **{"passes": 3, "entropy_low": False, "mi_low": True, "entropy_streak": 0, "mi_streak": 0},
        "warned": True,
    }
    monitor = CollapseMonitor(patience=1)
    with records() as logged:
        monitor.load_state_dict(old)
    assert [r.getMessage() for r in logged] == [
        "collapse monitor: the checkpoint's reference pass has no contrast; the next MI pass replaces it"
    ]
    assert monitor.state == RegimeState(passes=3, warned=True)
    # the next pass is the reference (healthy against itself); a collapse after it does not warn again
    assert metrics_of(monitor.observe(_pass(3, 1.9, 0.9, 0.35), 3))["diag/regime"] == 0.0
    with records() as logged:
        assert metrics_of(monitor.observe(_pass(4, 1.9, 0.1, 0.35), 4))["diag/regime"] == 1.0
    assert not warnings_of(logged) and monitor.state.first == PassMetrics(1.9, 0.9, 0.35)


# ---- real tiny runs -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def warned(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, list[logging.LogRecord]]:
    """Two iterations with the alarm at iteration 0 and on_collapse=warn; a pass at iteration 0 only."""
    run_dir = tmp_path_factory.mktemp("collapse") / "warn"
    _, logged = train(run_dir, [*ALARM_AT_FIRST_PASS, "iterations=2", "diagnostics.every_n_iterations=2"])
    return str(run_dir), logged


def test_warn_logs_the_regime_warns_once_and_keeps_running(warned) -> None:
    run_dir, logged = warned
    rows = metric_rows(run_dir)
    assert len(rows) == 2  # not stopped
    # diag/regime lands in the CSV logger on the iteration's own row, and only on iterations with a pass
    assert (rows[0]["diag/regime"], rows[0]["diag/regime_raw"]) == ("1.0", "1.0")
    assert rows[1]["diag/regime"] == "" and rows[1]["diag/first_turn/cond_entropy"] == ""
    (warning,) = warnings_of(logged)
    assert warning.startswith("template collapse at iteration 0 (first_turn MI pass 1, patience 1)")
    assert "stopping" not in warning
    state = saved_state(run_dir)
    assert state.regime == Regime.TEMPLATE_COLLAPSE and state.warned and state.passes == 1
    assert state.first is not None  # the CSV holds float32
    assert asdict(state.first) == pytest.approx(asdict(pass_of(rows[0])), rel=1e-6)


def test_resume_restores_the_state_and_does_not_warn_again(warned, tmp_path: Path) -> None:
    run_dir, _ = warned
    first = saved_state(run_dir).first
    ckpt = Path(run_dir) / "checkpoints" / "last.ckpt"
    resumed_dir = tmp_path / "resumed"
    _, logged = train(
        resumed_dir,
        [*ALARM_AT_FIRST_PASS, "iterations=3", "diagnostics.every_n_iterations=2", f"ckpt_path={ckpt}"],
    )
    (row,) = metric_rows(str(resumed_dir))  # iteration 2, with a pass
    assert not [w for w in warnings_of(logged) if "input dependence lost" in w]
    state = saved_state(str(resumed_dir))
    assert state.passes == 2 and state.warned and state.first == first
    # patience 1: the declared regime is this pass's own, against the first pass of the original run
    expected = classify(pass_of(row), first, RegimeThresholds(mi_fraction=1.0))
    assert float(row["diag/regime"]) == float(expected) == float(state.regime)


def test_stop_ends_the_run_after_the_iteration_of_the_alarm(tmp_path: Path) -> None:
    overrides = [*ALARM_AT_FIRST_PASS, "iterations=3", "callbacks.collapse.on_collapse=stop"]
    _, logged = train(tmp_path / "stop", overrides)
    rows = metric_rows(str(tmp_path / "stop"))
    assert len(rows) == 1 and rows[0]["diag/regime"] == "1.0"  # 3 iterations asked, 1 run
    (warning,) = warnings_of(logged)
    assert warning.startswith("template collapse at iteration 0") and warning.endswith(
        "; stopping (on_collapse=stop)"
    )
    assert saved_state(str(tmp_path / "stop")).warned  # the checkpoint of the last iteration still written


# ---- several processes ----------------------------------------------------------------------------

DDP_SCRIPT = """
import json
import sys

import lightning as L
import torch

from ragen2.callbacks import CollapseMonitor
from ragen2.diagnostics.findings import Findings
from ragen2.diagnostics.mi_pass import CurvePass, MIPass

HEALTHY = {"cond_entropy": 2.0, "contrast": 1.0, "retrieval_above_chance": 0.4}
TEMPLATE = {"cond_entropy": 1.9, "contrast": 0.1, "retrieval_above_chance": 0.0}


class Streams(L.Callback):
    # each rank's own MI passes, left in the findings as the MI callback leaves them: the monitor's whole
    # input (the real pass gathers every rank's rollouts, so its ranks could never disagree)
    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        values = TEMPLATE if trainer.global_rank == 1 and trainer.current_epoch >= 2 else HEALTHY
        pl_module.findings.mi = MIPass(trainer.current_epoch, {"first_turn": CurvePass(8, 8, 4, values)})


class Module(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.automatic_optimization = False
        self.weight = torch.nn.Parameter(torch.zeros(1))
        self.findings = Findings()

    def training_step(self, batch, batch_idx):
        pass

    def train_dataloader(self):
        return torch.utils.data.DataLoader(torch.zeros(1, 1), batch_size=1)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


class Report(L.Callback):
    def on_train_end(self, trainer, pl_module):
        out = {"epochs": trainer.current_epoch, "regime": int(pl_module.findings.regime.declared)}
        with open(f"{sys.argv[1]}/rank{trainer.global_rank}.json", "w") as f:
            json.dump(out, f)

    def teardown(self, trainer, pl_module, stage):
        # a spawned rank that exits with its gloo group alive can abort in the group's destructor
        # ("terminate called without an active exception", SIGABRT), failing the run after it finished
        if torch.distributed.is_initialized():
            torch.distributed.barrier()
            torch.distributed.destroy_process_group()


if __name__ == "__main__":
    L.Trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp_spawn",
        max_epochs=6,
        # the monitor first: it reads what Streams leaves, whatever the order of the callbacks
        callbacks=[CollapseMonitor(on_collapse="stop", patience=1), Streams(), Report()],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    ).fit(Module())
"""


@pytest.mark.slow
def test_every_rank_stops_together_when_one_rank_alone_sees_the_alarm(tmp_path: Path) -> None:
    # Two CPU ranks (gloo). Rank 1's passes lose input dependence at iteration 2, rank 0's never do:
    # the stop decision is reduced over ranks, so both end after iteration 2 of 6 (no rank left waiting
    # in a collective), each with its own regime.
    script = tmp_path / "ddp_stop.py"
    script.write_text(DDP_SCRIPT)
    proc = subprocess.run(
        [sys.executable, str(script), str(tmp_path)], capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert ranks == [{"epochs": 3, "regime": 0}, {"epochs": 3, "regime": 1}]
    assert "stopping after iteration 2: another rank declared input dependence lost" in proc.stdout
