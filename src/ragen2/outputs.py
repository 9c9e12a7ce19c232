"""Where a program's results go: checked at start-up, and written so that a failure keeps what was there.

``check_output`` runs before any work (no model loaded, nothing computed) and refuses, in one line naming the
setting and the fix, a destination

- that cannot be written (its folder cannot be created, is a file, or takes no new files);
- that holds the program's input (``ragen2-eval output=`` the checkpoint, ``ragen2-diagnose output=`` the
  folder of its rollouts file or of its checkpoint), with ``overwrite=true`` too;
- that holds another run's results (an ``eval.json``, an ``eval.seeds.jsonl``, a report), unless
  ``overwrite=true``;

and then creates the destination's folder. ``write_atomic`` writes a result beside its destination
(``.<name>.<pid>.tmp``), flushes and fsyncs it, renames it into place (``os.replace``, atomic within a
folder) and fsyncs the folder: a full disk or a kill mid-write leaves the previous file or none, never part
of one. Checkpoints are saved through the same ``replacing`` (``ragen2.callbacks.checkpoint``).

``ragen2-eval`` and ``ragen2-diagnose`` guard their ``output`` with it; a training run's folder has its own
guard (``ragen2.run_folder``).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from ragen2.errors import ConfigError
from ragen2.run_folder import unwritable


@dataclass(frozen=True)
class Output:
    """What a program writes under the setting ``key``."""

    key: str  # the setting that names it, as the command line spells it ("output")
    path: Path  # its value: the result file, or the folder that is the result
    kind: Literal["file", "folder"]  # what ``path`` names, for the messages
    folder: Path  # where the results go; created by ``check_output``
    results: tuple[Path, ...]  # the files written there: one that exists holds another run's results
    claims: tuple[Path, ...]  # what becomes the program's: no input may be one of these or lie inside one

    @classmethod
    def file(cls, key: str, path: Path, *companions: Path) -> Output:
        """A result file (and the files written beside it): any of them may hold an earlier run's results."""
        written = tuple(p.expanduser() for p in (path, *companions))
        return cls(key, path, "file", written[0].parent, written, written)

    @classmethod
    def report(cls, key: str, folder: Path, names: Sequence[str]) -> Output:
        """A folder that is the result (``names``: its files): nothing read may lie inside it."""
        where = folder.expanduser()
        return cls(key, folder, "folder", where, tuple(where / name for name in names), (where,))


def check_output(out: Output, inputs: Mapping[str, str | Path | None], overwrite: bool) -> None:
    """Refuse ``out`` where it cannot be written, holds one of ``inputs`` (key -> the path the program reads,
    None for none) or, unless ``overwrite``, another run's results; then create its folder."""
    problem = unwritable(out.folder.absolute())
    if problem:
        raise ConfigError(
            f"{out.key}={out.path} cannot be written: {problem}. Fix: {out.key}=<a {out.kind} in a writable folder>"
        )
    claims = [claim.resolve() for claim in out.claims]  # a symlink names what it points to
    read = {key: Path(value).expanduser().resolve() for key, value in inputs.items() if value is not None}
    for key, path in read.items():
        for claim in claims:
            if path == claim or claim in path.parents:
                raise ConfigError(
                    f"{out.key}={out.path} {'is' if path == claim else 'holds'} {key}={inputs[key]}: a run "
                    f"writes no results over or among what it reads. Fix: {out.key}=<another {out.kind}>"
                )
    held = [str(path) for path in out.results if path.exists()]
    if held and not overwrite:
        raise ConfigError(
            f"{out.key}={out.path} would replace an earlier run's results ({', '.join(held)}). Fix: "
            f"overwrite=true to replace them, or {out.key}=<another {out.kind}>"
        )
    out.folder.mkdir(parents=True, exist_ok=True)


@contextmanager
def replacing(target: Path) -> Iterator[Path]:
    """A temporary path beside ``target`` (``.<name>.<pid>.tmp``) for the block to write the new file to,
    flushed and fsynced: when the block ends it takes ``target``'s place and the folder is fsynced; when the
    block raises it is removed and ``target`` stays as it was."""
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        yield tmp
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, target)
    fsync_folder(target.parent)


def write_atomic(target: Path, text: str) -> None:
    """``target`` holds ``text`` (UTF-8), or, after any failure (a full disk, a kill), what it held before."""
    with replacing(target) as tmp, tmp.open("wb") as f:
        f.write(text.encode())
        f.flush()
        os.fsync(f.fileno())


def fsync_folder(folder: Path) -> None:
    """Make the renames in ``folder`` durable (a rename lives in the folder's entry, not in the file)."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
