"""Two CPU ranks (gloo) roll out one iteration as one rank does (``multirank_iteration.py``): the groups are
split between them, the SNR filter makes one selection over both, and the kept share and the logged numbers
are the whole iteration's; with DAPO's dynamic sampling too."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from helpers import launch_ranks

HERE = Path(__file__).resolve().parent
SCRIPT = HERE / "multirank_iteration.py"
UNTIMED = ("time/", "perf/")  # seconds and rates vary run to run


def _launch(out: Path, world: int) -> list[dict]:
    launch_ranks(SCRIPT, [str(out)], world)
    return [torch.load(f"{out}.rank{rank}", weights_only=False) for rank in range(world)]


@pytest.mark.slow  # three processes that import Lightning on 2 cores
@pytest.mark.timeout(600)
def test_two_ranks_select_as_one(tmp_path: Path) -> None:
    (one,) = _launch(tmp_path / "one.pt", 1)
    two = _launch(tmp_path / "two.pt", 2)
    plain = [r["plain"] for r in two]
    # rank r holds global groups 2r, 2r + 1: their seeds, scores and the filter's choice are one rank's
    assert plain[0]["seeds"] + plain[1]["seeds"] == one["plain"]["seeds"]
    for key in ("keep", "scores", "keep_rows"):
        assert torch.equal(torch.cat([r[key] for r in plain]), one["plain"][key]), key
    kept = [int(r["keep"].sum()) * 4 for r in plain]
    assert 0 < sum(kept) < 16, "the filter should drop some groups here"
    assert [r["share"] for r in plain] == [(0, sum(kept), 16), (kept[0], sum(kept), 16)]
    assert one["plain"]["share"] == (0, sum(kept), 16)
    per_rank = [k / 4 for k in kept]
    assert plain[0]["metrics"]["filter/kept_groups_rank_min"] == min(per_rank)
    assert plain[0]["metrics"]["filter/kept_groups_rank_max"] == max(per_rank)
    for name in ("plain", "dynamic"):
        mine, theirs = two[0][name]["metrics"], one[name]["metrics"]
        assert two[1][name]["metrics"].keys() == mine.keys() == theirs.keys()
        for key, value in theirs.items():
            if not key.startswith(UNTIMED) and "rank_m" not in key:
                assert mine[key] == pytest.approx(value, rel=1e-9), (name, key)
    # dynamic sampling needed more than one round, and found the same informative groups on two ranks
    assert one["dynamic"]["metrics"]["filter/dynamic_rounds"] >= 2
