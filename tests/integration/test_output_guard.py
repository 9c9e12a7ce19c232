"""The output guard (``ragen2.outputs``) on the real programs: ``ragen2-eval`` and ``ragen2-diagnose`` refuse, at
start-up and in one line, an ``output`` that holds an earlier run's results (unless ``overwrite=true``), that
cannot be written, or that holds what they read; their JSON and Markdown results are written atomically."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_config_errors import no_model_loads  # noqa: F401  (the fixture: any model load fails)

from integration.test_diagnose import FILES, _diagnose
from integration.test_eval_export import _eval_args
from ragen2.config import compose
from ragen2.errors import ConfigError
from ragen2.outputs import replacing, write_atomic

BIN = Path(sys.executable).parent
NO_ROOM = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def _evaluate(out: Path, *overrides: str) -> dict[str, float]:
    from ragen2.eval import run

    return run(compose(_eval_args(out, *overrides), config_name="eval"))


def _bytes(*paths: Path) -> dict[Path, bytes]:
    return {path: path.read_bytes() for path in paths}


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


@pytest.mark.parametrize("program", ["ragen2-eval", "ragen2-diagnose"])
def test_the_command_line_refuses_an_earlier_runs_results_in_one_line(program: str, tmp_path: Path) -> None:
    if program == "ragen2-eval":
        out, kind = tmp_path / "eval.json", "file"
        held = [out, tmp_path / "eval.seeds.jsonl"]
    else:
        out, kind = tmp_path / "report", "folder"
        held = [out / "index.md"]
        out.mkdir()
    for path in held:
        path.write_text("an earlier run's")
    done = subprocess.run(
        [str(BIN / program), f"output={out}", f"hydra.run.dir={tmp_path / 'run'}"],
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
    assert all(path.read_text() == "an earlier run's" for path in held)


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
