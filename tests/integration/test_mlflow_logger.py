"""logger=mlflow in the real loop, read back from its real local store: a run logs each iteration to one MLflow
run, and a resume from an earlier checkpoint continues that run without repeating an iteration."""

from __future__ import annotations

import csv
import importlib.util
from pathlib import Path

import pytest

from ragen2.config import compose, validate
from ragen2.errors import ConfigError

mlflow_tracking = pytest.importorskip(
    "mlflow.tracking", reason="the mlflow extra: pip install -e '.[mlflow]'"
)


def _csv_losses(run_dir: Path) -> dict[int, float]:
    """step -> train/loss, as metrics.csv holds them."""
    with (run_dir / "csv" / "metrics.csv").open(newline="") as f:
        return {int(r["step"]): float(r["train/loss"]) for r in csv.DictReader(f) if r.get("train/loss")}


def _mlflow_losses(client, run_id: str) -> list[tuple[int, float]]:
    return sorted((m.step, m.value) for m in client.get_metric_history(run_id, "train/loss"))


@pytest.mark.slow
def test_a_run_logs_to_mlflow_and_a_resume_continues_its_run(train) -> None:
    _, cfg = train(["logger=mlflow", "iterations=2"])
    run_dir = Path(cfg.run_dir)
    run_id = (run_dir / "mlflow_run_id").read_text().strip()
    client = mlflow_tracking.MlflowClient(f"file:{run_dir / 'mlruns'}")
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED"
    assert run.info.run_name == f"{cfg.env.id}-{cfg.algo.name}-s{cfg.seed}"
    first = _csv_losses(run_dir)
    assert len(first) == 2
    assert _mlflow_losses(client, run_id) == sorted(first.items())
    # every column of metrics.csv but the step, "@k" spelled "_at_k" (MLflow refuses "@")
    with (run_dir / "csv" / "metrics.csv").open(newline="") as f:
        columns = set(next(csv.reader(f))) - {"step"}
    assert set(run.data.metrics) == {c.replace("@", "_at_") for c in columns}
    assert "diag/first_turn/retrieval_acc_at_2" in run.data.metrics

    # resumed from the save after iteration 0: iteration 1 again (its first values are stale), then iteration 2
    older = run_dir / "checkpoints" / "last.1.ckpt"
    assert older.is_file()
    train(["logger=mlflow", "iterations=3", f"ckpt_path={older}"])
    assert (run_dir / "mlflow_run_id").read_text().strip() == run_id
    runs = client.search_runs([run.info.experiment_id])
    assert [r.info.run_id for r in runs] == [run_id]  # continued, not a second run
    assert client.get_run(run_id).info.status == "FINISHED"
    resumed = _csv_losses(run_dir)
    assert len(resumed) == 3
    losses = _mlflow_losses(client, run_id)
    assert losses == sorted(resumed.items())  # each step once, with the values the resumed run logged
    assert losses[0] == (min(first), first[min(first)])  # iteration 0 kept from the first attempt


def test_a_run_id_the_store_does_not_hold_starts_a_new_run(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from ragen2.loggers import MLFlowLogger

    id_file = tmp_path / "mlflow_run_id"
    id_file.write_text("0123456789abcdef0123456789abcdef\n")  # a run of a store since deleted
    logger = MLFlowLogger(run_id_file=str(id_file), save_dir=str(tmp_path / "mlruns"), experiment_name="x")
    logger.log_metrics({"a@2": 1.0}, step=0)
    assert "is not in" in caplog.text and "starting a new MLflow run" in caplog.text
    run_id = id_file.read_text().strip()
    assert run_id == logger.run_id != "0123456789abcdef0123456789abcdef"
    client = mlflow_tracking.MlflowClient(f"file:{tmp_path / 'mlruns'}")
    assert client.get_run(run_id).data.metrics == {"a_at_2": 1.0}


def test_logger_mlflow_without_mlflow_is_one_line_naming_the_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "mlflow" else find_spec(name, *a)
    )
    cfg = compose(["logger=mlflow"], run_dir=str(tmp_path / "run"))
    with pytest.raises(ConfigError) as err:
        validate(cfg)
    assert str(err.value) == (
        "logger.mlflow logs to MLflow, which is not installed. Fix: pip install 'ragen2[mlflow]' "
        "(from a checkout: pip install -e '.[mlflow]'), or logger=default"
    )
    assert not (tmp_path / "run").exists()  # refused before anything was written
