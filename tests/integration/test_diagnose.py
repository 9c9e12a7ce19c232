"""ragen2-diagnose end to end: sampling first turns, reading a run's saved rollouts, refusing bad settings."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import hydra
import pytest

from ragen2.config import compose
from ragen2.diagnose import run
from ragen2.diagnostics.mi import METRIC_KEYS
from ragen2.diagnostics.regimes import Regime
from ragen2.diagnostics.report import Row, Splits, diagnose, misretrieved, read_jsonl, rows_from_episodes
from ragen2.errors import ConfigError

FAST = ("model=tiny", "rollout=scripted", "env=sokoban")
FILES = ("metrics.json", "heatmap.png", "quadrant.png", "ranks.png", "rows.jsonl", "index.md")


def _diagnose(tmp_path: Path, *overrides: str):
    out = tmp_path / "report"
    cfg = compose([*FAST, f"output={out}", *overrides], config_name="diagnose")
    return run(cfg, overrides), out


def test_samples_first_turns_and_writes_the_report(tmp_path: Path) -> None:
    diag, out = _diagnose(tmp_path, "num_seeds=4", "samples=3")
    for name in FILES:
        assert (out / name).is_file() and (out / name).stat().st_size > 0, name
    record = json.loads((out / "metrics.json").read_text())
    assert set(METRIC_KEYS) <= set(record["metrics"])
    assert record["region"] in {"healthy", "template collapse", "compressed", "collapsed"}
    rows, cols = diag.scores.logp_sum.shape
    assert rows == len(diag.rows) <= 4 * 3 and cols == len({r.prompt_ids for r in diag.rows}) >= 2
    assert all(len(r.prompt_ids) > 50 for r in diag.rows)  # X is the rendered turn-1 prompt
    assert record["metrics"]["token_bound_ratio"] <= 1.0  # packed scoring runs no padding
    lines = (out / "rows.jsonl").read_text().splitlines()
    assert len(lines) == rows and all(1 <= json.loads(line)["rank"] <= cols for line in lines)
    index = (out / "index.md").read_text()
    for name in ("heatmap.png", "quadrant.png", "ranks.png"):
        assert f"]({name})" in index
    assert f"over {cols} distinct prompts" in index
    assert record["misretrieved"] and "## Samples that score at least as well" in index
    assert set(record["seconds"]) == {"load", "rollout", "cross-scoring"}


@pytest.mark.parametrize(
    ("entropy", "mi", "regime"),
    [
        (0.6, 0.2, Regime.HEALTHY),
        (0.6, 0.1, Regime.TEMPLATE_COLLAPSE),  # at the split counts as low
        (0.5, 0.2, Regime.COMPRESSED),
        (0.1, 0.0, Regime.COLLAPSED),
    ],
)
def test_splits_name_the_papers_regimes(entropy: float, mi: float, regime: Regime) -> None:
    assert Splits(mi_fraction=0.1, entropy=0.5).regime(entropy, mi) is regime


def test_misretrieved_rows_are_those_ranked_below_the_top(small_llama) -> None:
    x1, x2 = (1, 2, 3), (1, 2, 4)
    rows = [
        Row(x, z, seed, 0, f"state {seed}", "") for seed, x in enumerate((x1, x2)) for z in ((5, 6), (7,))
    ]
    diag = diagnose(small_llama, rows)
    wrong = misretrieved(diag, limit=10)
    assert [w["row"] for w in sorted(wrong, key=lambda w: w["row"])] == [
        r for r in range(4) if int(diag.rank[r]) > 1
    ]
    assert [w["margin"] for w in wrong] == sorted((w["margin"] for w in wrong), reverse=True)
    assert all(w["margin"] >= 0 and w["best_other_column"] != w["own_column"] for w in wrong)
    assert diag.metrics["misretrieved_rows"] == len(wrong)
    with pytest.raises(ValueError, match="fewer than 2 distinct prompts"):
        diagnose(small_llama, rows[:2])


def test_read_jsonl_refuses_other_files(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"turns": []}\n')
    with pytest.raises(ValueError, match="lacks"):
        read_jsonl(bad)
    bad.write_text("not json\n")
    with pytest.raises(ValueError, match="not JSON"):
        read_jsonl(bad)


def _saved_rollouts(run_dir: Path) -> tuple[Path, Any, Any]:
    """A real run's rollouts file (one iteration of 4 groups × 4 episodes, a line each), its data module and
    the batch it holds."""
    cfg = compose([*FAST, "rollout.save_jsonl=true", "rollout.groups=4"], run_dir=str(run_dir))
    dm = hydra.utils.instantiate(cfg.data)
    dm.setup()
    batch = dm.rollout(0)
    return run_dir / "rollouts.rank0.jsonl", dm, batch


def test_reads_a_runs_saved_rollouts(tmp_path: Path) -> None:
    saved, dm, batch = _saved_rollouts(tmp_path / "run")
    assert saved.is_file()

    diag, _ = _diagnose(tmp_path, f"rollouts={saved}", "num_seeds=64", "samples=64")
    decode = lambda ids: dm.tokenizer.decode(list(ids), skip_special_tokens=False)  # noqa: E731
    sampled = rows_from_episodes(batch.episodes, decode)
    # Z re-extracted from the saved ids is the runner's own Z, row for row
    assert [(r.prompt_ids, r.reasoning_ids) for r in diag.rows] == [
        (r.prompt_ids, r.reasoning_ids) for r in sampled
    ]
    assert diag.info["source"].endswith("iteration 0, first turns")

    capped, _ = _diagnose(tmp_path / "capped", f"rollouts={saved}", "num_seeds=2", "samples=1")
    assert len(capped.rows) == 2 and capped.scores.logp_sum.shape == (2, 2)


def test_a_rollouts_file_is_read_whole_once_for_the_check_and_the_run(tmp_path: Path) -> None:
    from ragen2.diagnose import _read_chosen, check

    saved, _, _ = _saved_rollouts(tmp_path / "run")
    cfg = compose([*FAST, f"output={tmp_path / 'report'}", f"rollouts={saved}"], config_name="diagnose")
    _read_chosen.cache_clear()
    assert check(cfg)[1:3] == check(cfg)[1:3] == ("ragen2", 0)  # the settings check's call, then the run's
    assert (_read_chosen.cache_info().misses, _read_chosen.cache_info().hits) == (1, 1)
    stat = saved.stat()
    os.utime(saved, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1))  # a file written since is read again
    check(cfg)
    assert _read_chosen.cache_info().misses == 2


@pytest.mark.parametrize(
    ("override", "match"),
    [
        ("num_seeds=1", "num_seeds=1"),
        ("samples=0", "samples=0"),
        ("rollouts=/nonexistent/rollouts.jsonl", "rollouts="),
        ("splits.mi_fraction=2", "mi_fraction"),
        ("max_batch_tokens=0", "max_batch_tokens=0"),
    ],
)
def test_bad_settings_are_refused_at_start(tmp_path: Path, override: str, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        _diagnose(tmp_path, override)


def test_a_rollouts_file_cut_mid_line_keeps_its_whole_lines(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    saved, _, _ = _saved_rollouts(tmp_path / "run")
    lines = saved.read_text().splitlines(keepends=True)
    whole = tmp_path / "whole.jsonl"
    whole.write_text("".join(lines[:-1]))
    cut = tmp_path / "cut.jsonl"  # the last line as a killed run leaves it: half written, no newline
    cut.write_text("".join(lines[:-1]) + lines[-1][: len(lines[-1]) // 2])

    expected, _ = _diagnose(tmp_path / "a", f"rollouts={whole}")
    diag, _ = _diagnose(tmp_path / "b", f"rollouts={cut}")
    (warning,) = [r.getMessage() for r in caplog.records if "cut short" in r.getMessage()]
    assert warning.startswith(f"rollouts={cut}: line {len(lines)} is cut short")
    assert [(r.prompt_ids, r.reasoning_ids) for r in diag.rows] == [
        (r.prompt_ids, r.reasoning_ids) for r in expected.rows
    ]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("", r"rollouts={path} holds no records\. Fix: "),
        ("\n\n", r"rollouts={path} holds no records\. Fix: "),
        ('{"a": 1', r"rollouts={path} holds no records\. Fix: "),  # a lone line cut short: nothing whole
        ('not json\n{"iteration": 0}\n', r"rollouts={path}: line 1 is not JSON \(Expecting value\)\. Fix: "),
        ('{"turns": []}\n', r"rollouts={path}: line 1 lacks iteration, seed: not a record written by "),
        ("[1, 2]\n", r"rollouts={path}: line 1 is JSON but not a record \(an object\)\. Fix: "),
        (
            '{"iteration": 0, "seed": 1, "turns": [{"prompt_ids": [1]}]}\n',
            r"rollouts={path}: line 1 lacks turns\[0\]\.observation, turns\[0\]\.sampled_ids: ",
        ),
        (
            '{"iteration": 0, "seed": 1, "turns": 3}\n',
            r"rollouts={path}: line 1 lacks turns \(a list of turns\)",
        ),
    ],
)
def test_a_bad_rollouts_file_is_refused_before_anything_loads(
    tmp_path: Path, content: str, message: str
) -> None:
    path = tmp_path / "rollouts.jsonl"
    path.write_text(content)
    # the checkpoint does not exist: an error about it would mean the file was not read first
    with pytest.raises(ConfigError, match="^" + message.format(path=path)):
        _diagnose(tmp_path, f"rollouts={path}", "checkpoint=/nonexistent.ckpt")


def test_an_iteration_the_file_lacks_is_refused_before_anything_loads(tmp_path: Path) -> None:
    path = tmp_path / "rollouts.jsonl"
    path.write_text('{"iteration": 3, "seed": 1, "turns": []}\n')
    with pytest.raises(
        ConfigError,
        match=rf"^iteration=5 is not in rollouts={path}, which holds iterations \[3\]\. Fix: iteration=3",
    ):
        _diagnose(tmp_path, f"rollouts={path}", "iteration=5", "checkpoint=/nonexistent.ckpt")


# ---- other trainers' rollouts (ragen2.diagnostics.readers; fixtures from tests/test_readers.py) ----


def test_a_trl_run_of_several_steps_gets_the_curves_over_steps(tmp_path: Path) -> None:
    from test_readers import PROMPTS, SAMPLES, write_trl

    run_dir = tmp_path / "trl"
    for step in (1, 2, 3):
        write_trl(run_dir, "copy" if step < 3 else "template", step)
    diag, out = _diagnose(tmp_path, f"rollouts={run_dir}", "num_seeds=64", "samples=64")
    assert diag.info["step"] == 3 and diag.info["source"].endswith("(trl), step 3, first turns")
    assert len(diag.rows) == PROMPTS * SAMPLES and diag.metrics["zero_variance_share"] == pytest.approx(0.5)
    curves = json.loads((out / "curves.json").read_text())
    assert [p["step"] for p in curves] == [1, 2, 3] and all(
        p["rows"] == PROMPTS * SAMPLES and "contrast" in p for p in curves
    )
    assert (out / "curves.png").stat().st_size > 0 and "## Over steps" in (out / "index.md").read_text()
    assert "## Reward variance" in (out / "index.md").read_text()

    chosen, again = _diagnose(tmp_path / "two", f"rollouts={run_dir}", "iteration=2", "curves=false")
    assert chosen.info["step"] == 2 and chosen.info["curves"] == [] and not (again / "curves.json").exists()
    with pytest.raises(
        ConfigError, match=r"^iteration=7 is not in rollouts=.*, which holds steps \[1, 2, 3\]"
    ):
        _diagnose(tmp_path / "seven", f"rollouts={run_dir}", "iteration=7")


def test_a_reader_that_finds_no_reasoning_fails_and_writes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "export.jsonl"
    reply = {"role": "assistant", "content": "<answer>ok</answer>"}  # no reasoning span
    path.write_text(
        "".join(
            json.dumps({"messages": [{"role": "user", "content": f"task {i}"}, reply], "reward": 1.0}) + "\n"
            for i in range(6)
        )
    )
    with pytest.raises(
        ConfigError, match=r"step 0: 0 of 6 rows hold a reasoning span .* over 0 distinct prompt"
    ):
        _diagnose(tmp_path, f"rollouts={path}")
    assert not any((tmp_path / "report").glob("*"))


@pytest.mark.parametrize(
    ("content", "message", "before_loading"),
    [
        (
            '{"question": "q"}\n',
            r"rollouts={path}: line 1 \(keys \['question'\]\) is in no known format",
            True,
        ),
        (
            '{"input": "q", "output": "<think>a</think>"}\n{"input": 3}\n',
            r"rollouts={path}: line 2 lacks input",
            False,
        ),
    ],
)
def test_a_bad_foreign_file_is_one_line_and_nothing_is_written(
    tmp_path: Path, content: str, message: str, before_loading: bool
) -> None:
    path = tmp_path / "dump.jsonl"
    path.write_text(content)
    # a missing checkpoint: refused for the file first where the file is refused before anything loads
    extra = ["checkpoint=/nonexistent.ckpt"] if before_loading else []
    with pytest.raises(ConfigError, match="^" + message.format(path=path)):
        _diagnose(tmp_path, f"rollouts={path}", *extra)
    assert not any((tmp_path / "report").glob("*"))


def test_format_names_the_reader_when_detection_cannot(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"^format='csv' is not a rollouts format"):
        _diagnose(tmp_path, "format=csv")
