"""LastCheckpoint's files: durable writes, the previous save kept, a full disk named, finite weights only, a
save at SIGTERM.

A real Lightning Trainer fits Lightning's own BoringModel (one batch per epoch, one save per epoch) in
seconds; the kill test saves 64 MB checkpoints in a subprocess and kills it in the middle of one.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.demos.boring_classes import BoringModel

from ragen2.callbacks import LastCheckpoint
from ragen2.lifecycle.checkpoint import DiskFullError, write_checkpoint
from ragen2.lifecycle.resume import last_checkpoint
from ragen2.models.checkpoint import read_checkpoint
from unit.checkpoint_writer import WEIGHT_BYTES, one_batch_trainer

HERE = Path(__file__).resolve().parent


def _fit(
    folder: Path, epochs: int, *callbacks: Callback, ckpt_path: str | None = None, **checkpoint: Any
) -> None:
    fit = one_batch_trainer(epochs, LastCheckpoint(dirpath=str(folder), **checkpoint), *callbacks)
    torch.manual_seed(0)
    fit.fit(BoringModel(), ckpt_path=ckpt_path, weights_only=True)


def _epochs(folder: Path) -> dict[str, int]:
    return {p.name: read_checkpoint(p)["epoch"] for p in sorted(folder.iterdir())}


def test_the_previous_save_is_kept_beside_last_ckpt(tmp_path: Path) -> None:
    folder = tmp_path / "checkpoints"
    folder.mkdir()
    (folder / ".last.ckpt.999999.tmp").write_bytes(b"half a checkpoint")  # a save killed mid-write
    _fit(folder, 3)  # the default: keep=2
    assert _epochs(folder) == {"last.1.ckpt": 1, "last.ckpt": 2}  # exactly two, nothing half-written
    last = str(folder / "last.ckpt")
    _fit(folder, 4, ckpt_path=last, keep=3)  # resumed (through the checkpoint IO), one save more
    assert _epochs(folder) == {"last.1.ckpt": 2, "last.2.ckpt": 1, "last.ckpt": 3}
    _fit(folder, 5, ckpt_path=last, keep=1)  # a smaller keep removes the saves it no longer keeps
    assert _epochs(folder) == {"last.ckpt": 4}


def test_a_kill_in_the_middle_of_a_save_leaves_a_checkpoint_that_loads(tmp_path: Path) -> None:
    folder = tmp_path / "checkpoints"
    # on a cluster $TMPDIR is often node-local and the run folder shared: two filesystems, as /dev/shm and
    # tmp_path are here (Lightning's save staged the file in $TMPDIR, then copied it over last.ckpt)
    staging = Path("/dev/shm") if Path("/dev/shm").is_dir() else tmp_path
    log = (tmp_path / "writer.log").open("w")
    writer = subprocess.Popen(
        [sys.executable, str(HERE / "checkpoint_writer.py"), str(folder), "1000"],
        env={**os.environ, "TMPDIR": str(staging), "OMP_NUM_THREADS": "1"},
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    saved, caught, deadline = False, None, time.monotonic() + 120
    try:
        while caught is None:  # kill it once a save is under way after at least one finished
            assert writer.poll() is None, (tmp_path / "writer.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "no save was seen in progress"
            entries = list(os.scandir(folder)) if folder.is_dir() else []
            sizes = {}
            for entry in entries:
                try:
                    sizes[entry.name] = entry.stat().st_size
                except FileNotFoundError:  # renamed away between the listing and the stat
                    continue
            saved = saved or any(size >= WEIGHT_BYTES for size in sizes.values())
            partial = [name for name, size in sizes.items() if size < WEIGHT_BYTES]
            if saved and partial:
                os.kill(writer.pid, signal.SIGKILL)
                caught = partial
            time.sleep(0.002)
    finally:
        if writer.poll() is None:
            writer.kill()
        writer.wait()
        log.close()
    newest = last_checkpoint(folder)
    assert newest is not None
    state = read_checkpoint(newest)  # the checkpoint a resume takes loads, whole
    assert state["state_dict"]["frozen"].numel() * 4 == WEIGHT_BYTES
    assert newest.name == "last.ckpt" or not (folder / "last.ckpt").exists(), (caught, sorted(sizes))


def test_a_full_disk_stops_the_run_and_keeps_the_save_before(tmp_path: Path) -> None:
    folder = tmp_path / "checkpoints"
    # from the second save on, no file may pass half a checkpoint's size: the write fails with EFBIG
    limit = WEIGHT_BYTES // 2
    writer = [sys.executable, str(HERE / "checkpoint_writer.py"), str(folder), "3", str(limit)]
    done = subprocess.run(
        writer, capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"}
    )
    assert done.returncode != 0
    # torch alone says "unexpected pos …"; the error names the folder, the cause and the sizes
    (line,) = [line for line in done.stderr.splitlines() if line.startswith("ragen2.lifecycle.checkpoint.")]
    assert line.startswith(
        f"ragen2.lifecycle.checkpoint.DiskFullError: callbacks.checkpoint.dirpath={folder}: the file-size "
        "limit (ulimit -f) is reached (File too large): the checkpoint needs about 64 MB, "
    ), line
    assert "last.ckpt was not written; the checkpoints already there are kept. Fix: " in line
    assert _epochs(folder) == {"last.ckpt": 0}  # the first save, whole; no temporary file left


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="no /dev/full (every write to it: ENOSPC)")
def test_a_write_to_a_full_disk_says_so(tmp_path: Path) -> None:
    target = tmp_path / "last.ckpt"
    torch.save({"w": torch.zeros(1000)}, target)
    before = target.read_bytes()
    with pytest.raises(
        DiskFullError,
        match=rf"^callbacks\.checkpoint\.dirpath={tmp_path}: the disk is full \(No space left on device\): "
        r"the checkpoint needs about [\d,]+ bytes, [\d,]+ MB is free\. last\.ckpt was not written",
    ):
        write_checkpoint({"w": torch.zeros(1000)}, Path("/dev/full"), target)
    assert target.read_bytes() == before


class _Poison(Callback):
    """NaN into one weight after the update of iteration ``epoch``."""

    def __init__(self, epoch: int) -> None:
        self.epoch = epoch

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        if trainer.current_epoch == self.epoch:
            with torch.no_grad():
                pl_module.layer.weight[1, 3] = float("nan")


def test_nonfinite_weights_stop_the_run_and_keep_the_finite_checkpoints(tmp_path: Path) -> None:
    folder = tmp_path / "checkpoints"
    with pytest.raises(
        RuntimeError, match=r"iteration 2: .*NaN or inf \(layer\.weight \(rank 0\)\).* not written"
    ):
        _fit(folder, 4, _Poison(epoch=2))
    assert _epochs(folder) == {"last.1.ckpt": 0, "last.ckpt": 1}
    assert torch.isfinite(read_checkpoint(folder / "last.ckpt")["state_dict"]["layer.weight"]).all()


class _Sigterm(Callback):
    """SIGTERM to this process during iteration ``epoch``, as ``scancel`` sends it."""

    def __init__(self, epoch: int) -> None:
        self.epoch = epoch

    def on_train_batch_start(self, trainer: L.Trainer, *args: Any) -> None:
        if trainer.current_epoch == self.epoch:
            os.kill(os.getpid(), signal.SIGTERM)


def test_sigterm_saves_the_iteration_in_progress_and_exits_143(tmp_path: Path) -> None:
    folder = tmp_path / "checkpoints"
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(SystemExit) as stopped:
        _fit(folder, 6, _Sigterm(epoch=1), every_n_iterations=3)  # iteration 1 is not a due save
    assert stopped.value.code == 128 + signal.SIGTERM
    assert _epochs(folder) == {"last.ckpt": 1}  # saved at the end of the signalled iteration, then stopped
    assert signal.getsignal(signal.SIGTERM) == before
