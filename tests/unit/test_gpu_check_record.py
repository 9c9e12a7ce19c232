"""bench/gpu_check.py's record: written after every step, and copied into $OUT on a lent machine, also when
--out already points there (a same-file copy ended the check after its first step)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from gpu_check import write_record


def test_the_record_is_copied_into_out_unless_it_is_there(tmp_path: Path) -> None:
    record = {"commit": "abc", "steps": {"tests": {"exit": 0}}}
    lent = tmp_path / "out"
    lent.mkdir()
    write_record(record, lent / "gpu.json", str(lent))  # --out $OUT/gpu.json: nothing to copy
    assert json.loads((lent / "gpu.json").read_text()) == record
    elsewhere = tmp_path / "bench" / "results" / "gpu.json"
    record["steps"]["decode"] = {"exit": 0}
    write_record(record, elsewhere, str(lent))
    assert json.loads(elsewhere.read_text()) == json.loads((lent / "gpu.json").read_text()) == record
    write_record({"commit": "def"}, tmp_path / "alone.json", None)  # no $OUT: the record alone
    assert sorted(p.name for p in lent.iterdir()) == ["gpu.json"]
