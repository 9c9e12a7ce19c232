"""bench/bench_malloc.py times the test command's own malloc setting (read from scripts/test.sh, the one
place it is written) against glibc's default, and each run's process sees only the setting it times."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from bench_malloc import command_tunables, timed


def test_the_setting_is_the_test_commands_export(tmp_path: Path) -> None:
    value = command_tunables()
    assert "glibc.malloc.mmap_threshold=" in value and "glibc.malloc.trim_threshold=" in value
    script = tmp_path / "test.sh"
    script.write_text("#!/usr/bin/env bash\npython -m pytest\n")
    with pytest.raises(ValueError, match="exports no GLIBC_TUNABLES"):
        command_tunables(script)


@pytest.mark.parametrize("tunables", [None, "glibc.malloc.trim_threshold=4294967296"])
def test_each_run_sees_only_its_own_setting(
    tunables: str | None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.arena_max=1")  # the caller's: never passed on
    probe = tmp_path / "test_probe.py"
    probe.write_text(
        f"import os\n\ndef test_env():\n    assert os.environ.get('GLIBC_TUNABLES') == {tunables!r}\n"
    )
    run = timed([str(probe)], tunables)
    assert run["exit"] == 0
    assert run["wall_s"] > 0 and run["user_s"] > 0 and run["minor_faults"] > 0 and run["peak_rss_gib"] > 0
