"""Resume on requeue: which checkpoint ``ckpt_path`` resolves to, and loggers that keep history across it."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from ragen2.config import compose
from ragen2.errors import ConfigError
from ragen2.lifecycle.resume import checkpoint_dir, requeue_plugins, resolve_ckpt_path, run_ckpt_path
from ragen2.loggers import CSVLogger, TensorBoardLogger, rows_before, wandb_run_id

SLURM_JOB = {"SLURM_JOB_ID": "42", "SLURM_RESTART_COUNT": "1"}
SUBMITIT_LOCAL_JOB = {"SUBMITIT_EXECUTOR": "local"}


def _touch(path: Path, mtime: float, epoch: int = 0) -> Path:
    """A small checkpoint as Lightning lays one out (the loader checks that it loads)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"epoch": epoch, "state_dict": {"policy.w": torch.full((2,), float(epoch))}}, path)
    os.utime(path, (mtime, mtime))
    return path


def test_auto_resumes_only_inside_a_restartable_job(tmp_path: Path) -> None:
    folder = tmp_path / "checkpoints"
    assert resolve_ckpt_path("auto", folder, SLURM_JOB) is None  # first start of the job: fresh
    last = _touch(folder / "last.ckpt", time.time())
    assert resolve_ckpt_path("auto", folder, SLURM_JOB) == str(last)
    assert resolve_ckpt_path("auto", folder, SUBMITIT_LOCAL_JOB) == str(last)
    # a local run never picks up a checkpoint it was not given, nor does null anywhere
    assert resolve_ckpt_path("auto", folder, {}) is None
    assert resolve_ckpt_path(None, folder, SLURM_JOB) is None


def test_auto_takes_the_newest_last_checkpoint(tmp_path: Path) -> None:
    # Lightning writes last-v1.ckpt when a fresh run starts in a folder that holds a last.ckpt
    now = time.time()
    _touch(tmp_path / "last.ckpt", now - 100)
    newer = _touch(tmp_path / "last-v1.ckpt", now)
    _touch(tmp_path / "epoch=3.ckpt", now + 100)  # not a last checkpoint
    assert resolve_ckpt_path("auto", tmp_path, SLURM_JOB) == str(newer)


def test_explicit_values(tmp_path: Path) -> None:
    ckpt = _touch(tmp_path / "some.ckpt", time.time())
    assert resolve_ckpt_path(str(ckpt), tmp_path, {}) == str(ckpt)
    with pytest.raises(ConfigError, match=r"ckpt_path=.*missing\.ckpt: no such checkpoint file\. Fix:"):
        resolve_ckpt_path(str(tmp_path / "missing.ckpt"), tmp_path, SLURM_JOB)


def test_hpc_is_lightnings_newest_hpc_checkpoint_and_none_is_one_line(tmp_path: Path) -> None:
    for environ, where in (({}, "and this is no SLURM job"), (SLURM_JOB, "in this SLURM job")):
        with pytest.raises(
            ConfigError,
            match=rf"^ckpt_path=hpc: there is no hpc_ckpt_<n>\.ckpt in {tmp_path} {where} \(Lightning writes .*\)\. "
            r"Fix: ckpt_path=last",
        ):
            resolve_ckpt_path("hpc", tmp_path / "checkpoints", environ, root=tmp_path)
    _touch(tmp_path / "hpc_ckpt_2.ckpt", time.time())
    newest = _touch(tmp_path / "hpc_ckpt_10.ckpt", time.time() - 60)  # the highest number, as Lightning picks
    assert resolve_ckpt_path("hpc", tmp_path / "checkpoints", {}, root=tmp_path) == str(newest)


@pytest.mark.parametrize("url", ["s3://bucket/last.ckpt", "https://example.org/last.ckpt"])
def test_remote_checkpoints_are_refused(url: str, tmp_path: Path) -> None:
    with pytest.raises(
        ConfigError, match=rf"^ckpt_path={url}: remote checkpoints are not loaded .* Fix: copy"
    ):
        resolve_ckpt_path(url, tmp_path, {})


def test_last_takes_the_newest_loadable_checkpoint_anywhere(tmp_path: Path) -> None:
    assert resolve_ckpt_path("last", tmp_path, {}) is None  # none yet: a fresh start, as Lightning does
    now = time.time()
    older = _touch(tmp_path / "last.1.ckpt", now - 10)
    last = _touch(tmp_path / "last.ckpt", now)
    assert resolve_ckpt_path("last", tmp_path, {}) == str(last)  # outside a job too
    last.write_bytes(b"")
    assert resolve_ckpt_path("last", tmp_path, {}) == str(older)


@pytest.mark.parametrize("damage", ["truncated", "garbage", "empty"])
def test_auto_falls_back_to_the_save_before_when_the_newest_does_not_load(
    damage: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    now = time.time()
    older = _touch(tmp_path / "last.1.ckpt", now - 10, epoch=3)
    newest = _touch(tmp_path / "last.ckpt", now, epoch=4)
    data = newest.read_bytes()
    newest.write_bytes(
        {"truncated": data[: len(data) // 2], "garbage": os.urandom(4096), "empty": b""}[damage]
    )
    os.utime(newest, (now, now))
    assert resolve_ckpt_path("auto", tmp_path, SLURM_JOB) == str(older)
    (warning,) = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert str(newest) in warning and f"resuming from the older {older} instead" in warning
    assert "\n" not in warning


def test_auto_stops_when_no_checkpoint_loads(tmp_path: Path) -> None:
    (tmp_path / "last.ckpt").write_bytes(b"")
    (tmp_path / "last.1.ckpt").write_bytes(b"PK\x03\x04 not really")
    with pytest.raises(
        ConfigError, match=r"no checkpoint in .* loads\. Fix: ckpt_path=<an intact checkpoint>"
    ):
        resolve_ckpt_path("auto", tmp_path, SLURM_JOB)


@pytest.mark.parametrize(
    ("content", "says"),
    [
        (b"", r"is empty \(0 bytes\)"),
        (b"\x80\x04garbage" * 100, r"is not a torch\.save checkpoint"),
        (None, r"is truncated or corrupt \(PytorchStreamReader failed reading zip archive"),
    ],
)
def test_a_ckpt_path_that_does_not_load_is_one_line_naming_it_and_the_fix(
    content: bytes | None, says: str, tmp_path: Path
) -> None:
    ckpt = _touch(tmp_path / "given.ckpt", time.time())
    data = ckpt.read_bytes()
    ckpt.write_bytes(data[: len(data) // 2] if content is None else content)
    with pytest.raises(
        ConfigError, match=rf"^ckpt_path={ckpt} {says}.*\. Fix: pass an intact checkpoint"
    ) as err:
        resolve_ckpt_path(str(ckpt), tmp_path, {})
    assert "\n" not in str(err.value)


def test_composed_config_resumes_from_its_run_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = compose(["model=tiny"], run_dir=str(tmp_path))
    assert cfg.ckpt_path == "auto"
    assert checkpoint_dir(cfg) == tmp_path / "checkpoints"
    assert (
        checkpoint_dir(compose(["~callbacks.checkpoint"], run_dir=str(tmp_path))) == tmp_path / "checkpoints"
    )
    last = _touch(tmp_path / "checkpoints" / "last.ckpt", time.time())
    for key in ("SLURM_JOB_ID", "SUBMITIT_EXECUTOR"):
        monkeypatch.delenv(key, raising=False)
    assert run_ckpt_path(cfg) is None
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    assert run_ckpt_path(cfg) == str(last)


def test_lightning_does_not_requeue_under_slurm(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in [k for k in os.environ if k.startswith("SLURM_")]:
        monkeypatch.delenv(key)
    assert requeue_plugins() == []
    monkeypatch.setenv("SLURM_NTASKS", "1")
    monkeypatch.setenv("SLURM_JOB_NAME", "ragen2")
    (env,) = requeue_plugins()
    assert type(env).__name__ == "SLURMEnvironment" and env.auto_requeue is False
    monkeypatch.setenv("SLURM_JOB_NAME", "bash")  # an interactive allocation: Lightning ignores SLURM too
    assert requeue_plugins() == []


def _csv_rows(save_dir: Path) -> list[dict[str, str]]:
    with (save_dir / "csv" / "metrics.csv").open(newline="") as f:
        return list(csv.DictReader(f))


def _csv_logger(save_dir: Path) -> CSVLogger:
    return CSVLogger(save_dir=str(save_dir), name="csv", version="", flush_logs_every_n_steps=1)


def test_rows_before() -> None:
    rows = [{"step": "0", "a": "1"}, {"step": "1", "a": "2"}, {"step": "1", "epoch": "1"}, {"step": "2"}]
    assert rows_before(rows, 1) == rows[:1]
    assert rows_before(rows, 0) == []
    assert rows_before([{"step": "", "a": "3"}], 0) == [{"step": "", "a": "3"}]


def test_csv_keeps_history_and_logs_each_step_once(tmp_path: Path) -> None:
    first = _csv_logger(tmp_path)
    for step in range(4):  # iterations 0..3, the last checkpoint after iteration 1: 2 and 3 are lost work
        first.log_metrics({"train/iteration": step, "train/loss": 10.0 + step}, step=step)
        first.save()
    first.log_metrics({"val/success": 0.5, "epoch": 3}, step=3)
    first.save()
    # the requeued job resumes after iteration 1, logs 2..4, and a column the first attempt never had
    second = _csv_logger(tmp_path)
    for step in range(2, 5):
        second.log_metrics({"train/iteration": step, "train/loss": 20.0 + step, "train/kl": 0.1}, step=step)
        second.save()
    rows = _csv_rows(tmp_path)
    assert [int(float(r["train/iteration"])) for r in rows] == [0, 1, 2, 3, 4]
    assert [float(r["train/loss"]) for r in rows] == [10.0, 11.0, 22.0, 23.0, 24.0]
    assert [r["train/kl"] for r in rows] == ["", "", "0.1", "0.1", "0.1"]
    assert "val/success" in rows[0]  # the stale row is gone, its column stays (empty)
    assert all(r["val/success"] == "" for r in rows)
    assert not (tmp_path / "csv" / "metrics.csv.tmp").exists()


def test_csv_restart_from_step_0_replaces_the_attempts_rows(tmp_path: Path) -> None:
    # a requeued job that saved no checkpoint starts over; another run is refused such a folder at start-up
    # (ragen2.lifecycle.folder), so the rows replaced are the job's own earlier attempt's
    old = _csv_logger(tmp_path)
    for step in range(3):
        old.log_metrics({"x": 1.0}, step=step)
        old.save()
    new = _csv_logger(tmp_path)
    new.log_metrics({"x": 2.0}, step=0)
    new.save()
    assert [(r["step"], r["x"]) for r in _csv_rows(tmp_path)] == [("0", "2.0")]


def test_csv_new_column_rewrites_beside_and_a_kill_mid_write_keeps_the_history(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    logger = _csv_logger(tmp_path)
    for step in range(3):
        logger.log_metrics({"train/loss": float(step)}, step=step)
        logger.save()
    before = (tmp_path / "csv" / "metrics.csv").read_bytes()

    class Killed(BaseException):
        """The job killed while the file is rewritten under its new header."""

    def killed(self: csv.DictWriter, rows: object) -> None:
        raise Killed

    monkeypatch.setattr(csv.DictWriter, "writerows", killed)
    with pytest.raises(Killed):
        logger.log_metrics({"train/loss": 3.0, "val/success": 0.5}, step=3)  # a column appears: rewrite
    assert (tmp_path / "csv" / "metrics.csv").read_bytes() == before
    monkeypatch.undo()
    restarted = _csv_logger(tmp_path)  # the job again, from its checkpoint after step 2
    restarted.log_metrics({"train/loss": 3.0, "val/success": 0.5}, step=3)
    rows = _csv_rows(tmp_path)
    assert [r["train/loss"] for r in rows] == ["0.0", "1.0", "2.0", "3.0"]
    assert [r["val/success"] for r in rows] == ["", "", "", "0.5"]


def test_tensorboard_restart_hides_the_lost_steps(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    first = TensorBoardLogger(save_dir=str(tmp_path), name="tb", version="", default_hp_metric=False)
    for step in range(4):
        first.log_metrics({"train/loss": 10.0 + step}, step=step)
    first.finalize("failed")
    # event files are named by the second they were opened in, and TensorBoard reads them in that order
    time.sleep(1.1)
    second = TensorBoardLogger(save_dir=str(tmp_path), name="tb", version="", default_hp_metric=False)
    for step in range(2, 5):
        second.log_metrics({"train/loss": 20.0 + step}, step=step)
    second.finalize("success")
    assert len(list((tmp_path / "tb").glob("events.out.tfevents.*"))) == 2
    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("train/loss")] == [
        (0, 10.0),
        (1, 11.0),
        (2, 22.0),
        (3, 23.0),
        (4, 24.0),
    ]


def test_wandb_run_id_is_one_per_run_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a").mkdir()
    assert wandb_run_id("a") == wandb_run_id(tmp_path / "a") == wandb_run_id(str(tmp_path / "a") + "/")
    assert wandb_run_id("a") != wandb_run_id("b")
    assert len(wandb_run_id("a")) == 16 and wandb_run_id("a").isalnum()


def test_loggers_are_saved_before_submitit_requeues(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import signal

    calls: list[bool] = []
    metrics = tmp_path / "csv" / "metrics.csv"
    # stands in for submitit's USR2 handler, which runs `scontrol requeue` (the job is killed right after)
    original = signal.signal(signal.SIGUSR2, lambda *_: calls.append(metrics.is_file()))
    try:
        monkeypatch.setenv("SUBMITIT_EXECUTOR", "slurm")
        monkeypatch.delenv("SUBMITIT_PREEMPT_SIGNAL", raising=False)
        requeue_plugins()
        chained = signal.getsignal(signal.SIGUSR2)
        requeue_plugins()  # a second run in the process does not chain the step twice
        assert signal.getsignal(signal.SIGUSR2) is chained
        held = CSVLogger(save_dir=str(tmp_path), name="csv", version="", flush_logs_every_n_steps=100)
        held.log_metrics({"train/iteration": 0}, step=0)  # buffered: the next flush would be at step 99
        assert not metrics.is_file()
        signal.raise_signal(signal.SIGUSR2)
        assert calls == [True]  # the row was on disk when the requeueing handler ran
    finally:
        signal.signal(signal.SIGUSR2, original)


# submitit's requeue handler, in front of which ragen2 saves the loggers, ends the job with SystemExit; the
# signal lands inside a finalizer (here a __del__ that signals its own process), where Python drops exceptions
REQUEUE_IN_A_FINALIZER = """
import signal, sys
from ragen2.lifecycle.resume import _SaveFirst

def requeue(sig, frame):
    print("requeued", flush=True)
    sys.exit(-1)

signal.signal(signal.SIGUSR2, _SaveFirst(lambda: print("saved", flush=True), requeue))

class Closer:
    def __del__(self):
        signal.raise_signal(signal.SIGUSR2)

Closer()
print("went on after the requeue", flush=True)
"""


def _job(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)


def test_a_requeue_signal_inside_a_finalizer_still_ends_the_job() -> None:
    done = _job(REQUEUE_IN_A_FINALIZER)
    assert done.stdout.splitlines() == ["saved", "requeued"], done.stderr
    assert done.returncode == 255  # submitit's sys.exit(-1)


def test_a_requeue_signal_elsewhere_raises_the_handlers_exit() -> None:
    done = _job(REQUEUE_IN_A_FINALIZER.replace("Closer()", "signal.raise_signal(signal.SIGUSR2)"))
    assert done.stdout.splitlines() == ["saved", "requeued"] and done.returncode == 255, done.stderr
    assert "Traceback" not in done.stderr  # a plain SystemExit, as submitit raises it


def test_a_requeue_cut_short_by_slurms_sigterm_ends_the_job_as_requeued() -> None:
    """SLURM's SIGTERM to the requeued step can kill ``scontrol requeue`` before it returns: the job is requeued,
    and ends as submitit ends one (its exit), not as a failed job; any other failed command still raises."""
    cut = REQUEUE_IN_A_FINALIZER.replace(
        '    print("requeued", flush=True)\n    sys.exit(-1)',
        '    import subprocess\n    raise subprocess.CalledProcessError(-15, ["scontrol", "requeue", "1"])',
    ).replace("Closer()", "signal.raise_signal(signal.SIGUSR2)")
    done = _job(cut)
    lines = done.stdout.splitlines()
    assert lines[0] == "saved" and lines[1].endswith("ending it for the requeue"), done.stdout
    assert done.returncode == 255 and "Traceback" not in done.stderr, done.stderr  # submitit's sys.exit(-1)
    failed = _job(cut.replace("-15", "1"))  # scontrol refused: a real failure
    assert failed.returncode == 1 and "CalledProcessError" in failed.stderr
