"""The test command's scheduling table (tests/conftest.py) names real files and units: a renamed file would
otherwise drop out of its shared unit, or out of the long units handed out first, without a word."""

from __future__ import annotations

from pathlib import Path

from conftest import LONGEST_UNITS, SHARED_UNITS

ROOT = Path(__file__).resolve().parents[1]


def test_every_shared_file_exists() -> None:
    assert [f for f in SHARED_UNITS if not (ROOT / f).is_file()] == []


def test_every_long_unit_is_a_shared_unit_or_a_file_of_its_own() -> None:
    shared = set(SHARED_UNITS.values())
    alone = [u for u in LONGEST_UNITS if u not in shared]
    assert [u for u in alone if not (ROOT / u).is_file() or u in SHARED_UNITS] == []
    assert shared <= set(LONGEST_UNITS) and len(set(LONGEST_UNITS)) == len(LONGEST_UNITS)
