"""The output guard (``ragen2.outputs``) on the real programs: ``ragen2-eval`` and ``ragen2-diagnose`` refuse, at
start-up and in one line, an ``output`` that holds an earlier run's results (unless ``overwrite=true``), that
cannot be written, or that holds what they read; their JSON and Markdown results are written atomically.
``ragen2-warmstart`` and ``ragen2-export`` build their model folder beside the destination and swap it in, and
refuse a destination that would drop it over or among a training run's files or its input."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from test_config_errors import no_model_loads  # noqa: F401  (the fixture: any model load fails)

from integration.test_diagnose import FILES, _diagnose
from integration.test_eval_export import _eval_args, _refused
from ragen2 import outputs
from ragen2.config import compose
from ragen2.errors import ConfigError
from ragen2.models.loading import resolve_model_path
from ragen2.outputs import replacing, replacing_folder, write_atomic

BIN = Path(sys.executable).parent
NO_ROOM = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def _evaluate(out: Path, *overrides: str) -> dict[str, float]:
    from ragen2.eval import run

    return run(compose(_eval_args(out, *overrides), config_name="eval"))


def _bytes(*paths: Path) -> dict[Path, bytes]:
    return {path: path.read_bytes() for path in paths}


def _hashes(folder: Path) -> dict[str, str]:
    """Every file under ``folder`` (relative path -> sha256): what must come out of a refusal byte-identical."""
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


# the fewest demonstrations and steps ragen2-warmstart takes, on the tiny model: seconds
WARM = ("model=tiny", "demos.episodes=4", "sft.steps=1", "sft.batch_size=4", "trainer.accelerator=cpu")


def _warmstart(run_dir: Path, *overrides: str) -> dict:
    from ragen2.warmstart import run

    return run(compose([*WARM, *overrides], config_name="warmstart", run_dir=str(run_dir)))


def _a_run(folder: Path) -> Path:
    """A training run's folder (its checkpoint, its Hydra record, its metrics); returns the checkpoint."""
    for name, text in (("checkpoints/last.ckpt", "a checkpoint"), (".hydra/config.yaml", "seed: 0\n")):
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)
    (folder / "csv").mkdir()
    (folder / "csv" / "metrics.csv").write_text("step,loss\n0,1.0\n")
    return folder / "checkpoints" / "last.ckpt"


def _a_model(folder: Path) -> Path:
    """An earlier warm start's model folder (its file names; the bytes do not matter to the guard)."""
    folder.mkdir(parents=True)
    for name in ("config.json", "model.safetensors", "warmstart.json"):
        (folder / name).write_text(f"an earlier {name}")
    return folder


def _unwritable(tmp_path: Path) -> Path:
    """A folder in which no file can be created: a read-only one, or, for root (whom chmod does not stop), one
    under a regular file."""
    if os.geteuid() == 0:
        (tmp_path / "afile").write_text("a file")
        return tmp_path / "afile" / "out"
    folder = tmp_path / "read-only"
    folder.mkdir(mode=0o500)
    return folder


def test_a_second_eval_into_the_same_output_is_refused_and_overwrite_replaces(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "eval.json"
    seeds = tmp_path / "eval.seeds.jsonl"
    _evaluate(out)
    first = _bytes(out, seeds)
    refused = (
        rf"^output={out} would replace an earlier run's results \({out}, {seeds}\)\. Fix: overwrite=true to "
    )
    with pytest.raises(ConfigError, match=refused + r"replace them, or output=<another file>$"):
        _evaluate(out, "seed=1")
    assert _bytes(out, seeds) == first
    # either file is another run's: the per-seed lines of an interrupted evaluation count too
    out.unlink()
    with pytest.raises(
        ConfigError, match=rf"^output={out} would replace an earlier run's results \({seeds}\)\."
    ):
        _evaluate(out, "seed=1")
    out.write_bytes(first[out])

    # overwrite=true on a disk that fills as eval.json is written: the earlier summary stays whole
    def full(fd: int) -> None:
        raise NO_ROOM

    with monkeypatch.context() as patch:
        patch.setattr(os, "fsync", full)
        with pytest.raises(OSError, match="No space left on device"):
            _evaluate(out, "seed=1", "overwrite=true")
    assert out.read_bytes() == first[out] and sorted(p.name for p in tmp_path.iterdir()) == [
        out.name,
        seeds.name,
    ]

    replaced = _evaluate(out, "seed=1", "overwrite=true")
    assert out.read_bytes() != first[out] and seeds.read_bytes() != first[seeds]
    assert json.loads(out.read_text())["greedy/success"] == replaced["greedy/success"]


def test_a_second_diagnose_into_a_report_is_refused_and_overwrite_replaces(tmp_path: Path) -> None:
    _, report = _diagnose(tmp_path, "num_seeds=2", "samples=2")
    first = _bytes(*(report / name for name in FILES))
    with pytest.raises(
        ConfigError,
        match=rf"^output={report} would replace an earlier run's results \({report / 'metrics.json'}, .*"
        rf"{report / 'index.md'}\)\. Fix: overwrite=true to replace them, or output=<another folder>$",
    ):
        _diagnose(tmp_path, "num_seeds=2", "samples=2", "seed=1")
    assert _bytes(*first) == first
    _diagnose(tmp_path, "num_seeds=2", "samples=2", "seed=1", "overwrite=true")
    assert (report / "metrics.json").read_bytes() != first[report / "metrics.json"]
    assert sorted(p.name for p in report.iterdir()) == sorted(FILES)  # and no temporary file left


@pytest.mark.parametrize("program", ["ragen2-eval", "ragen2-diagnose", "ragen2-warmstart"])
def test_the_command_line_refuses_an_earlier_runs_results_in_one_line(program: str, tmp_path: Path) -> None:
    args: list[str] = []
    if program == "ragen2-eval":
        out, kind = tmp_path / "eval.json", "file"
        held = [out, tmp_path / "eval.seeds.jsonl"]
    elif program == "ragen2-diagnose":
        out, kind = tmp_path / "report", "folder"
        held = [out / "index.md"]
        out.mkdir()
    else:  # its default output, <run>/model, holding an earlier warm start's model
        out, kind = _a_model(tmp_path / "run" / "model"), "folder"
        held, args = [out], list(WARM)
    for path in held:
        if not path.is_dir():
            path.write_text("an earlier run's")
    before = _hashes(tmp_path)
    done = subprocess.run(
        [str(BIN / program), *(args or [f"output={out}"]), f"hydra.run.dir={tmp_path / 'run'}"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=300,
    )
    assert done.returncode == 1
    assert done.stderr.splitlines() == [
        f"{program}: output={out} would replace an earlier run's results ({', '.join(map(str, held))}). Fix: "
        f"overwrite=true to replace them, or output=<another {kind}>"
    ]
    after = _hashes(tmp_path)  # and Hydra's record of the refused run (.hydra/, its log) beside them
    assert {name: after[name] for name in before} == before


def test_an_unwritable_output_is_refused_before_the_model_loads(
    no_model_loads: None,  # noqa: F811
    tmp_path: Path,
) -> None:
    folder = _unwritable(tmp_path)
    out = folder / "eval.json"
    with pytest.raises(
        ConfigError,
        match=rf"^output={out} cannot be written: .*\. Fix: output=<a file in a writable folder>$",
    ):
        _evaluate(out)
    with pytest.raises(
        ConfigError,
        match=rf"^output={folder / 'report'} cannot be written: .*\. Fix: output=<a folder in a writable folder>$",
    ):
        _diagnose(folder)
    assert not folder.exists() or not any(folder.iterdir())


def test_an_output_holding_the_input_is_refused_even_with_overwrite(
    no_model_loads: None,  # noqa: F811
    tmp_path: Path,
) -> None:
    run_dir = tmp_path / "run"
    (run_dir / "checkpoints").mkdir(parents=True)
    ckpt, rollouts = run_dir / "checkpoints" / "last.ckpt", run_dir / "rollouts.rank0.jsonl"
    ckpt.write_bytes(b"a checkpoint")
    rollouts.write_text("rollouts\n")
    fix = "a run writes no results over or among what it reads. Fix: output=<another"
    for overwrite in ("overwrite=false", "overwrite=true"):
        with pytest.raises(ConfigError, match=rf"^output={ckpt} is checkpoint={ckpt}: {fix} file>$"):
            _evaluate(ckpt, f"checkpoint={ckpt}", overwrite)
        for output, read in ((run_dir, f"rollouts={rollouts}"), (ckpt.parent, f"checkpoint={ckpt}")):
            from ragen2.diagnose import run

            args = ["model=tiny", "rollout=scripted", f"output={output}", read, overwrite]
            with pytest.raises(ConfigError, match=rf"^output={output} holds {read}: {fix} folder>$"):
                run(compose(args, config_name="diagnose"), args)
    assert ckpt.read_bytes() == b"a checkpoint" and rollouts.read_text() == "rollouts\n"
    assert sorted(p.name for p in run_dir.rglob("*")) == ["checkpoints", "last.ckpt", "rollouts.rank0.jsonl"]


def test_a_write_that_fails_midway_keeps_the_earlier_file_and_leaves_no_temporary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "eval.json"
    target.write_text('{"pass@1": 0.5}')
    # the disk fills halfway through the new file
    with pytest.raises(OSError, match="No space left on device"), replacing(target) as tmp:
        tmp.write_text('{"pass@1": ')
        raise NO_ROOM
    assert target.read_text() == '{"pass@1": 0.5}' and [p.name for p in tmp_path.iterdir()] == ["eval.json"]

    # or once it is written, at the fsync: the earlier file, and on a first write no file at all
    def full(fd: int) -> None:
        raise NO_ROOM

    monkeypatch.setattr(os, "fsync", full)
    for path, before in ((target, '{"pass@1": 0.5}'), (tmp_path / "index.md", None)):
        with pytest.raises(OSError, match="No space left on device"):
            write_atomic(path, "# a new report\n")
        assert (path.read_text() if path.exists() else None) == before
    assert [p.name for p in tmp_path.iterdir()] == ["eval.json"]
    monkeypatch.undo()
    write_atomic(target, '{"pass@1": 0.75}')
    assert target.read_text() == '{"pass@1": 0.75}' and [p.name for p in tmp_path.iterdir()] == ["eval.json"]


def test_a_warm_start_into_a_folder_with_a_model_or_its_run_folder_again_is_refused_before_work(
    no_model_loads: None,  # noqa: F811
    tmp_path: Path,
) -> None:
    run_dir = tmp_path / "run"
    model = _a_model(run_dir / "model")
    (run_dir / "csv").mkdir()
    (run_dir / "csv" / "metrics.csv").write_text("step,sft/loss\n0,1.0\n")
    other = _a_model(tmp_path / "exported")
    before = _hashes(tmp_path)
    fix = r"\. Fix: overwrite=true to replace them, or output=<another folder>$"
    with pytest.raises(
        ConfigError, match=rf"^output={model} would replace an earlier run's results \({model}\){fix}"
    ):
        _warmstart(run_dir, "seed=1")  # its own run folder again
    with pytest.raises(
        ConfigError, match=rf"^output={other} would replace an earlier run's results \({other}\){fix}"
    ):
        _warmstart(tmp_path / "new", f"output={other}")
    assert _hashes(tmp_path) == before and not (tmp_path / "new" / "model").exists()


@pytest.mark.parametrize("overwrite", ["overwrite=false", "overwrite=true"])
def test_a_warm_start_over_a_run_or_its_input_is_refused_even_with_overwrite(
    overwrite: str,
    no_model_loads: None,  # noqa: F811
    tmp_path: Path,
) -> None:
    other = tmp_path / "other"
    _a_run(other)
    base = tmp_path / "models" / "base"
    shutil.copytree(resolve_model_path("tiny"), base)
    run_dir = tmp_path / "warm"
    before = _hashes(tmp_path)
    drop = r": replacing it would remove that run's files\. Fix: output=<another folder>$"
    parts = r"\(checkpoints/, \.hydra/, csv/metrics\.csv\)"
    reads = r": a run writes no results over or among what it reads\. Fix: output=<another folder>$"
    cases = [
        (other, rf"^output={other} is the training run {other} {parts}{drop}"),
        (
            other / "checkpoints",
            rf"^output={other / 'checkpoints'} is in the training run {other} {parts}{drop}",
        ),
        (base, rf"^output={base} is model\.name_or_path={base}{reads}"),
        (base.parent, rf"^output={base.parent} holds model\.name_or_path={base}{reads}"),
        (run_dir, rf"^output={run_dir} is run_dir={run_dir}{reads}"),
    ]
    for output, message in cases:
        with pytest.raises(ConfigError, match=message):
            _warmstart(run_dir, f"model.name_or_path={base}", f"output={output}", overwrite)
    assert _hashes(tmp_path) == before


def test_overwrite_replaces_a_warm_starts_model_and_an_interrupted_swap_keeps_the_old_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_dir = tmp_path / "run"
    _warmstart(run_dir)
    model = run_dir / "model"
    first = _hashes(model)
    assert {"config.json", "model.safetensors", "warmstart.json"} <= set(first)

    # the new folder is written, then the swap fails: the old folder stays whole, nothing staged is left
    def fails(staged: Path, folder: Path) -> None:
        raise OSError(errno.EIO, "the swap fails")

    with monkeypatch.context() as patch:
        patch.setattr(outputs, "swap_in", fails)
        with pytest.raises(OSError, match="the swap fails"):
            _warmstart(run_dir, "seed=1", "overwrite=true")
    assert _hashes(model) == first
    assert not [p.name for p in run_dir.iterdir() if p.name.startswith(".model.")]

    record = _warmstart(run_dir, "seed=1", "overwrite=true")
    replaced = _hashes(model)
    assert set(replaced) == set(first) and replaced["model.safetensors"] != first["model.safetensors"]
    assert json.loads((model / "warmstart.json").read_text()) == record and record["seed"] == 1
    assert not [p.name for p in run_dir.iterdir() if p.name.startswith(".model.")]


def test_an_export_over_its_checkpoint_or_a_run_is_refused_even_with_overwrite(
    no_model_loads: None,  # noqa: F811
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    run, other = tmp_path / "run", tmp_path / "other"
    ckpt = _a_run(run)
    _a_run(other)
    before = _hashes(tmp_path)
    reads = (
        f"checkpoint={ckpt}: a run writes no results over or among what it reads. Fix: out=<another folder>"
    )
    drop = ": replacing it would remove that run's files. Fix: out=<another folder>"
    parts = "(checkpoints/, .hydra/, csv/metrics.csv)"
    cases = [
        (run / "checkpoints", f"out={run / 'checkpoints'} holds {reads}"),
        (run, f"out={run} holds {reads}"),
        (tmp_path, f"out={tmp_path} holds {reads}"),
        (other, f"out={other} is the training run {other} {parts}{drop}"),
        (other / "csv", f"out={other / 'csv'} is in the training run {other} {parts}{drop}"),
        (
            other / "checkpoints" / "exported",
            f"out={other / 'checkpoints' / 'exported'} is in the training run {other} {parts}{drop}",
        ),
    ]
    for out, message in cases:
        for flags in ((), ("--overwrite",)):
            assert _refused(capsys, str(ckpt), str(out), *flags) == f"ragen2-export: {message}"
    assert _hashes(tmp_path) == before


def test_export_overwrite_replaces_a_previous_export_and_an_interrupted_swap_keeps_it(
    train, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ragen2.export import main as export_main

    _, cfg = train(["iterations=1"])
    ckpt = Path(cfg.run_dir) / "checkpoints" / "last.ckpt"
    out = tmp_path / "exported"
    export_main([str(ckpt), str(out)])
    (out / "a note").write_text("an earlier export's")
    first = _hashes(out)

    def fails(staged: Path, folder: Path) -> None:
        raise OSError(errno.EIO, "the swap fails")

    with monkeypatch.context() as patch:
        patch.setattr(outputs, "swap_in", fails)
        with pytest.raises(OSError, match="the swap fails"):
            export_main([str(ckpt), str(out), "--overwrite"])
    assert _hashes(out) == first
    export_main([str(ckpt), str(out), "--overwrite"])
    replaced = _hashes(out)
    assert "a note" not in replaced and replaced["config.json"] == first["config.json"]
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".")]  # nothing staged or moved aside


def test_a_swap_that_fails_after_the_old_folder_moved_aside_puts_it_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = _a_model(tmp_path / "model")
    first = _hashes(folder)
    rename = os.replace

    def second_fails(src: Path, dst: Path) -> None:
        if Path(src).name.endswith(".tmp"):  # the new folder into place: the old one is aside by now
            raise OSError(errno.EIO, "the rename fails")
        rename(src, dst)

    monkeypatch.setattr(os, "replace", second_fails)
    with pytest.raises(OSError, match="the rename fails"), replacing_folder(folder) as staged:
        (staged / "config.json").write_text("the new one")
    assert _hashes(folder) == first and [p.name for p in tmp_path.iterdir()] == ["model"]
