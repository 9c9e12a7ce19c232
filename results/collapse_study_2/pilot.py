"""The second study's pilot rule (PROTOCOL.md), applied to the pilot runs: collapses, breaks or holds, and the
learning rate that follows (the study's, the next pilot's, or none).

    python results/collapse_study_2/pilot.py results/collapse_study_2/pilot/5e-5/0 [results/collapse_study_2/pilot/<lr>/0] \
        --out results/collapse_study_2/pilot

A pilot run is read on the held-out curve at its last MI pass against its pass at iteration 0: it
**collapses** if MI_last ≤ ½ MI_0 with at least 32 of the pass's rows valid, **breaks** if fewer than 32 are
valid, and **holds** otherwise. Pilot 1 runs at 5e-5; if it breaks, pilot 2 runs at 2e-5, if it holds, at
1e-4; the first pilot that collapses names the study's rate, and if pilot 2 does not, the study does not run.
Writes pilot.json (with the commit, the machine and the command) and pilot.md.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from provenance import provenance

HERE = Path(__file__).resolve().parent


def _analysis():  # results/ is no package: the first study's analyze.py, loaded from its file
    spec = importlib.util.spec_from_file_location("analyze", HERE.parent / "collapse_study" / "analyze.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


analyze = _analysis()
MI, H = analyze.curve_keys("heldout")
VALID = "diag/heldout/valid_rows"
MIN_VALID = 32.0  # of the pass's 16 × 4 rows: below it, the MI reads a broken format, not reasoning
FIRST = 5e-5
SECOND = {"breaks": 2e-5, "holds": 1e-4}  # pilot 2's rate, by pilot 1's verdict


def reading(run: dict[str, object]) -> dict[str, object]:
    """One pilot run's verdict: its rate, its first and last held-out passes, collapses | breaks | holds."""
    its: dict[int, dict[str, float]] = run["iterations"]  # type: ignore[assignment]
    passes = sorted(
        i for i, m in its.items() if VALID in m
    )  # a pass logs valid_rows even when too few for MI
    finished = any("val/success" in m for m in its.values())  # validation runs once, at the end
    if len(passes) < 2 or passes[0] != 0 or not finished:
        raise ValueError(
            f"{run['folder']}: held-out passes at iterations {passes}, validation {'run' if finished else 'not run'}; "
            "the rule reads a finished run's pass at iteration 0 and its last. Fix: run the pilot to its end"
        )
    first, last = its[passes[0]], its[passes[-1]]
    mi0, mit, valid = first.get(MI), last.get(MI), last[VALID]
    if valid < MIN_VALID or mit is None:
        verdict = "breaks"
    elif mi0 is not None and mit <= 0.5 * mi0:
        verdict = "collapses"
    else:
        verdict = "holds"
    return {
        "folder": run["folder"],
        "lr": run["lr"],
        "seed": run["seed"],
        "filter": run["filter"],
        "iterations": [passes[0], passes[-1]],
        "mi": [mi0, mit],
        "cond_entropy": [first.get(H), last.get(H)],
        "valid_rows": [first[VALID], valid],
        "verdict": verdict,
    }


def decide(readings: list[dict[str, object]]) -> dict[str, object]:
    """The rule over pilot 1 (and pilot 2): the study's rate, or the next pilot's, or no study."""
    if not readings or readings[0]["lr"] != FIRST:  # floats: 5e-5 and 5e-05 are one rate
        raise ValueError(f"pilot 1 runs at lr {FIRST:g} (PROTOCOL.md); got {[r['lr'] for r in readings]}")
    if any((r["seed"], r["filter"]) != (0, "none") for r in readings):
        raise ValueError("a pilot is seed 0, filter=none (PROTOCOL.md): run it with PILOT=1")
    one = readings[0]
    if one["verdict"] == "collapses":
        return {
            "study_lr": FIRST,
            "next_pilot": None,
            "outcome": f"pilot 1 collapses: the study runs at lr {FIRST:g}",
        }
    second = SECOND[str(one["verdict"])]
    if len(readings) == 1:
        return {
            "study_lr": None,
            "next_pilot": second,
            "outcome": f"pilot 1 {one['verdict']}: pilot 2 at lr {second:g}",
        }
    if len(readings) > 2 or readings[1]["lr"] != second:
        raise ValueError(
            f"after pilot 1 {one['verdict']}, pilot 2 runs at lr {second:g}, and no pilot 3 runs"
        )
    if readings[1]["verdict"] == "collapses":
        return {
            "study_lr": second,
            "next_pilot": None,
            "outcome": f"pilot 2 collapses: the study runs at lr {second:g}",
        }
    return {
        "study_lr": None,
        "next_pilot": None,
        "outcome": f"no collapse with a readable format at lr {FIRST:g} or {second:g}: the study does not run "
        "(a refutation of (a) for this setting; a next step is a new amendment)",
    }


def read(folder: Path) -> dict[str, object]:
    """A pilot run's folder as ``reading`` takes it: analyze.py's reading plus its learning rate."""
    run = analyze.read_run(folder)
    return {**run, "lr": float(analyze.overrides(folder)["algo.optim.lr"])}  # the last override wins


def markdown(result: dict[str, object]) -> str:
    lines = ["# The second study's pilot (pilot.py)", "", f"**{result['outcome']}**", ""]
    lines += [
        "| run | lr | passes | MI (nats) | H(Z\\|X) | valid rows of 64 | verdict |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in result["pilots"]:  # type: ignore[union-attr]
        mi = " → ".join("–" if x is None else f"{x:.3f}" for x in r["mi"])
        h = " → ".join("–" if x is None else f"{x:.3f}" for x in r["cond_entropy"])
        rows = " → ".join(f"{x:.0f}" for x in r["valid_rows"])
        lines.append(
            f"| {r['folder']} | {r['lr']:g} | {r['iterations'][0]}, {r['iterations'][1]} | {mi} | {h} | {rows} | {r['verdict']} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", type=Path, nargs="+", help="pilot 1's run folder, then pilot 2's")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    try:
        readings = [reading(read(folder)) for folder in args.runs]
        result = {"provenance": provenance(), "pilots": readings, **decide(readings)}
    except ValueError as error:
        sys.exit(f"pilot.py: {error}")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "pilot.json").write_text(json.dumps(result, indent=1) + "\n")
    (args.out / "pilot.md").write_text(markdown(result))
    print(markdown(result))


if __name__ == "__main__":
    main(sys.argv[1:])
