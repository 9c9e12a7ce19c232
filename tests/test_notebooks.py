"""Execute every notebook end to end and check what it shows.

Each notebook runs in a fresh kernel of *this* interpreter (ipykernel's built-in ``python3`` spec, not
whatever kernel specs the jupyter paths hold), from a temporary working directory, with
``RAGEN2_NOTEBOOK_SMOKE=1`` (the MI notebook scores fewer prompts with the 135M model; the diagnose
notebook runs on the tiny model throughout). A probe cell
appended to the notebook prints its key variables as JSON; a cell error fails the test with the cell's
traceback. The notebooks assert their own invariants (token layout, the collapse demo) inside.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import nbformat
import pytest
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import KernelManager
from nbclient import NotebookClient

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
PROBE_TAG = "PROBE "

pytestmark = pytest.mark.slow  # kernel start-up, imports and the 135M scorer: minutes on a small CPU


def execute(name: str, probe: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[dict, list]:
    """Run notebook ``name`` plus a probe cell printing ``PROBE <json>``; return the probe and all outputs."""
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code"), (
        f"{name} is committed with outputs"
    )
    probe_cell = (
        "import json as _json, sys as _sys\n"
        f"_probe = {probe}\n"
        "_probe['executable'] = _sys.executable\n"
        f"print({PROBE_TAG!r} + _json.dumps(_probe, default=float))"
    )
    nb.cells.append(nbformat.v4.new_code_cell(probe_cell))
    monkeypatch.setenv("RAGEN2_NOTEBOOK_SMOKE", "1")
    # the notebooks' run folders (tempfile.mkdtemp, kept for a user to look into) go in the test's folder,
    # which pytest removes, not in /tmp
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    kernel = KernelManager(kernel_name="python3", kernel_spec_manager=KernelSpecManager(kernel_dirs=[]))
    client = NotebookClient(nb, km=kernel, timeout=300, resources={"metadata": {"path": str(tmp_path)}})
    # nbclient stops only the kernels it made itself: without cleanup_kc this one (~0.5 GB) would live on
    # until the test process ends
    client.execute(cleanup_kc=True)
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    line = next(
        line
        for o in nb.cells[-1].outputs
        if o.output_type == "stream"
        for line in o.text.splitlines()
        if line.startswith(PROBE_TAG)
    )
    found = json.loads(line[len(PROBE_TAG) :])
    assert Path(found["executable"]).resolve() == Path(sys.executable).resolve(), "kernel ran another Python"
    return found, outputs


def _count(outputs: list, mime: str) -> int:
    return sum(mime in o.get("data", {}) for o in outputs)


def _printed(outputs: list) -> str:
    return "".join(o.text for o in outputs if o.output_type == "stream")


def test_rollouts_and_filter(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    probe = """{
        "groups": batch.num_groups,
        "table_rows": len(groups),
        "table_kept": groups["kept"].tolist(),
        "keep": batch.keep.tolist(),
        "kept_ratio": batch.record.as_metrics()["filter/kept_ratio"],
        "layout_segments": sorted(set(layout["segment"])),
        "sweep": sweep.to_dict("records"),
        "comparison": comparison["kept_ratio"].to_dict(),
    }"""
    found, outputs = execute("01_rollouts_and_filter.ipynb", probe, tmp_path, monkeypatch)
    assert found["groups"] == found["table_rows"] == 16
    assert found["table_kept"] == found["keep"] and 0 < sum(found["keep"]) < 16
    assert {"prompt", "Z1", "A1"} <= set(found["layout_segments"])
    linear = [r for r in found["sweep"] if r["strategy"] == "top_p linear"]
    assert [r["p"] for r in linear] == [round(0.5 + 0.05 * i, 2) for i in range(11)]
    ratios = [r["kept_ratio"] for r in linear]
    assert ratios == sorted(ratios)  # a larger p never keeps fewer groups
    # the sweep's p = 0.9 point is the configured default filter the batch was rolled out with
    assert next(r["kept_ratio"] for r in linear if r["p"] == 0.9) == found["kept_ratio"]
    assert found["comparison"]["none"] == 1.0  # the table rounds to 3 decimals
    assert found["comparison"]["top_p"] == pytest.approx(found["kept_ratio"], abs=1e-3)
    assert _count(outputs, "image/png") == 1  # the sweep plot
    assert _count(outputs, "text/markdown") == 2  # the kept and the dropped episode
    assert _count(outputs, "text/html") >= 1
    assert "⟦Z1 " in _printed(outputs)  # the bracketed token layout


def test_mi_diagnostics(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    probe = """{
        "rows": len(rows),
        "shape": list(scores.logp_sum.shape),
        "metrics": metrics,
        "toy": toy,
        "demo": {f"{m}/{w}": v for (m, w), v in demo.items()},
        "n_demo": N_DEMO,
    }"""
    found, outputs = execute("02_mi_diagnostics.ipynb", probe, tmp_path, monkeypatch)
    assert found["shape"] == [found["rows"], 8] and found["rows"] > 8
    assert found["metrics"]["retrieval_chance"] == 1 / 8
    assert found["n_demo"] == 4  # the smoke setting reached the kernel
    toy = found["toy"]
    assert toy["collapsed"]["cond_entropy"] == pytest.approx(toy["grounded"]["cond_entropy"])
    assert toy["grounded"]["mi_est"] > 0.5 > abs(toy["collapsed"]["mi_est"])
    demo = found["demo"]
    assert demo["builtin/grounded"]["retrieval_acc"] == 1.0
    assert demo["builtin/grounded"]["mi_est"] > 0.2 > abs(demo["builtin/collapsed"]["mi_est"])
    assert _count(outputs, "image/png") == 3  # batch, hand-made and LM heatmaps


def test_diagnose(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    probe = """{
        "episodes": len(records),
        "iterations": sorted({r["iteration"] for r in records}),
        "iteration": iteration,
        "rows": len(rows),
        "prompts": len({r.prompt_ids for r in rows}),
        "metrics": {k: metrics[k] for k in ("mi_est", "retrieval_acc", "retrieval_chance", "rows", "columns")},
        "cli": {k: cli.metrics[k] for k in ("mi_est", "retrieval_acc", "rows", "columns")},
        "region": diag.info["region"],
        "report": sorted(p.name for p in REPORT.iterdir()),
        "misretrieved": len(wrong),
    }"""
    found, outputs = execute("03_diagnose.ipynb", probe, tmp_path, monkeypatch)
    # 2 iterations × 8 Sokoban groups × 4 rollouts saved; the last iteration's first turns read back
    assert found["episodes"] == 64 and found["iterations"] == [0, 1] and found["iteration"] == 1
    assert found["prompts"] == 8 and 8 < found["rows"] <= 32
    metrics = found["metrics"]
    assert metrics["columns"] == 8 and metrics["rows"] == found["rows"]
    assert metrics["retrieval_chance"] == 1 / 8
    # the command line on the same file gives the same numbers
    assert found["cli"] == {k: metrics[k] for k in found["cli"]}
    # canned reasonings, the same for every state: input-blind by construction
    assert found["region"] == "template collapse" and abs(metrics["mi_est"]) < 0.05
    assert {"metrics.json", "heatmap.png", "quadrant.png", "ranks.png", "rows.jsonl", "index.md"} <= set(
        found["report"]
    )
    assert 0 < found["misretrieved"] <= 6
    assert _count(outputs, "image/png") == 3  # heatmap, quadrant, ranks
    assert _count(outputs, "text/markdown") == 1  # the CLI's index.md


def test_organism(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    probe = """{
        "iterations": ITERATIONS,
        "passes": passes.index.tolist(),
        "exact": passes["diag/exact/mi"].tolist(),
        "mass": passes["diag/exact/grammar_mass"].tolist(),
        "shares": list(shares.columns),
        "correlations": correlations,
    }"""
    found, outputs = execute("04_organism.ipynb", probe, tmp_path, monkeypatch)
    assert found["iterations"] == 40  # the smoke setting reached the kernel
    assert found["passes"] == [0, 10, 20, 30]
    # the shipped warm start reads its input: exact MI well above 0 and under the ceiling log 64
    assert all(1.0 < mi < math.log(64) for mi in found["exact"])
    assert min(found["mass"]) > 0.9
    assert len(found["shares"]) == 6 and len(found["correlations"]) == 5
    assert _count(outputs, "image/png") == 2  # the curves (with the scatter) and success by kind
