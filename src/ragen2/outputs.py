"""Where a program's results go: checked at start-up, and written so that a failure keeps what was there.

``check_output`` runs before any work (no model loaded, nothing computed) and refuses, in one line naming the
setting and the fix, a destination

- that cannot be written (its folder cannot be created, is a file, or takes no new files);
- that holds the program's input (``ragen2-eval output=`` the checkpoint, ``ragen2-diagnose output=`` the
  folder of its rollouts file or of its checkpoint), with ``overwrite=true`` too;
- that holds another run's results (an ``eval.json``, an ``eval.seeds.jsonl``, a report, a model folder that
  is not empty), unless ``overwrite=true``;
- that is replaced as a whole (``Output.model``) where that would remove a training run's files
  (``run_files``), with ``overwrite=true`` too;

and then creates the destination's folder (a whole folder's parent). ``write_atomic`` writes a result beside its destination
(``.<name>.<pid>.tmp``), flushes and fsyncs it, renames it into place (``os.replace``, atomic within a
folder) and fsyncs the folder: a full disk or a kill mid-write leaves the previous file or none, never part
of one. Checkpoints are saved through the same ``replacing`` (``ragen2.lifecycle.checkpoint``). A model
folder is built beside its destination and swapped in (``replacing_folder``): a failure before the swap
leaves the old folder whole.

``ragen2-eval``, ``ragen2-diagnose`` and ``ragen2-warmstart`` guard their ``output`` with it, ``ragen2-export``
its destination with ``check_apart``, ``run_files`` and ``replacing_folder``; a training run's folder has its
own guard (``ragen2.lifecycle.folder``).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from ragen2.errors import ConfigError

#: a run's metrics file, relative to its folder
METRICS = Path("csv") / "metrics.csv"


def unwritable(folder: Path) -> str | None:
    """Why ``folder`` could not be created and written, or None."""
    existing = folder
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        return f"{existing} is a file, not a folder"
    try:
        with tempfile.TemporaryFile(dir=existing):
            return None
    except OSError as err:
        return f"{existing} does not take new files ({err.strerror})"


# what makes a folder a training run's: a run folder holds one of these (csv/: its metrics.csv)
RUN_PARTS = ("checkpoints", ".hydra", "csv")


@dataclass(frozen=True)
class Output:
    """What a program writes under the setting ``key``."""

    key: str  # the setting that names it, as the command line spells it ("output")
    path: Path  # its value: the result file, or the folder that is the result
    kind: Literal["file", "folder"]  # what ``path`` names, for the messages
    folder: Path  # where the results go; created by ``check_output``
    results: tuple[Path, ...]  # the files written there: one that exists holds another run's results
    claims: tuple[Path, ...]  # what becomes the program's: no input may be one of these or lie inside one
    whole: bool = False  # ``path`` is a folder replaced as a whole: no training run's files may be in it

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

    @classmethod
    def model(cls, key: str, folder: Path) -> Output:
        """A folder replaced as a whole (``replacing_folder``), built beside it: anything in it is an earlier
        run's, and nothing read may lie inside it."""
        where = folder.expanduser()
        return cls(key, folder, "folder", where.parent, (where,), (where,), whole=True)


def check_output(out: Output, inputs: Mapping[str, str | Path | None], overwrite: bool) -> None:
    """Refuse ``out`` where it cannot be written, holds one of ``inputs`` (key -> the path the program reads,
    None for none), would remove a training run's files (a whole folder) or, unless ``overwrite``, another
    run's results. It writes nothing: the program's claim on the folder makes it (``ragen2.lifecycle.folder``),
    so a run refused by a later check leaves no folder behind."""
    problem = unwritable(out.folder.absolute())
    if problem:
        raise ConfigError(
            f"{out.key}={out.path} cannot be written: {problem}. Fix: {out.key}=<a {out.kind} in a writable folder>"
        )
    check_apart(out.key, out.path, out.kind, out.claims, inputs)
    if out.whole:
        check_no_run(out.key, out.path)
    held = [str(path) for path in out.results if holds(path)]
    if held and not overwrite:
        raise ConfigError(
            f"{out.key}={out.path} would replace an earlier run's results ({', '.join(held)}). Fix: "
            f"overwrite=true to replace them, or {out.key}=<another {out.kind}>"
        )


def check_apart(
    key: str, path: Path, kind: str, claims: Sequence[Path], inputs: Mapping[str, str | Path | None]
) -> None:
    """Refuse ``key=path`` when one of ``inputs`` (key -> a path the program reads or keeps, None for none) is
    one of ``claims`` (what the program writes over) or lies inside one."""
    resolved = [claim.expanduser().resolve() for claim in claims]  # a symlink names what it points to
    read = {name: Path(value).expanduser().resolve() for name, value in inputs.items() if value is not None}
    for name, where in read.items():
        for claim in resolved:
            if where == claim or claim in where.parents:
                raise ConfigError(
                    f"{key}={path} {'is' if where == claim else 'holds'} {name}={inputs[name]}: a run "
                    f"writes no results over or among what it reads. Fix: {key}=<another {kind}>"
                )


def check_outside(key: str, path: Path, kind: str, folders: Mapping[str, str | Path | None]) -> None:
    """Refuse ``key=path`` inside one of ``folders`` (key -> a folder the program reads, None for none): its
    results would land among the files it reads (an ``eval.json`` in the model folder)."""
    where = path.expanduser().resolve()
    for name, value in folders.items():
        folder = None if value is None else Path(value).expanduser()
        if folder is not None and folder.is_dir() and folder.resolve() in where.parents:
            raise ConfigError(
                f"{key}={path} lies in {name}={value}: a run writes no results over or among what it reads. "
                f"Fix: {key}=<a {kind} outside it>"
            )


def check_no_run(key: str, folder: Path) -> None:
    """Refuse ``key=folder``, a folder replaced as a whole, when that would remove a training run's files or
    put a file's place in a folder's."""
    where = folder.expanduser()
    if where.is_file():
        raise ConfigError(
            f"{key}={folder} is a file, and the result is a folder. Fix: {key}=<another folder>"
        )
    found = run_files(where)
    if found:
        raise ConfigError(
            f"{key}={folder} {found}: replacing it would remove that run's files. Fix: {key}=<another folder>"
        )


def run_files(folder: Path) -> str | None:
    """Which training run's files replacing ``folder`` would remove, in words, or None: the run ``folder`` is,
    the one whose ``checkpoints/``, ``.hydra/`` or ``csv/`` it is or lies in, or one inside it."""
    where = folder.resolve()
    for above in (where, *where.parents):
        parts = run_parts(above)
        if parts and (above == where or where.relative_to(above).parts[0] in RUN_PARTS):
            return f"is {'' if above == where else 'in '}the training run {above} ({', '.join(parts)})"
    for inside, _, _ in os.walk(where):  # nothing when it does not exist
        parts = run_parts(Path(inside))
        if parts:
            return f"holds the training run {inside} ({', '.join(parts)})"
    return None


def run_parts(folder: Path) -> list[str]:
    """What of a training run ``folder`` holds: ``checkpoints/``, ``.hydra/``, ``csv/metrics.csv``."""
    found = [f"{name}/" for name in RUN_PARTS[:2] if (folder / name).is_dir()]
    return found + ([str(METRICS)] if (folder / METRICS).is_file() else [])


def holds(path: Path) -> bool:
    """Whether ``path`` holds results: a file, or a folder that is not empty."""
    return path.is_file() or (path.is_dir() and any(path.iterdir()))


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


def current_umask() -> int:
    """The process's umask (os.umask only reads it by setting it: put back at once)."""
    mask = os.umask(0)
    os.umask(mask)
    return mask


def share(folder: Path) -> None:
    """``folder`` and all in it as the user's umask allows (mkdtemp makes a folder 0700, safetensors a file
    0600): a result (an export, a cached model) that a vLLM server or a shared cache under another account
    reads as it reads the user's other files."""
    mask = current_umask()
    for path in (folder, *folder.rglob("*")):
        full = 0o777 if path.is_dir() or path.stat().st_mode & 0o111 else 0o666
        path.chmod(full & ~mask)


@contextmanager
def replacing_folder(folder: Path) -> Iterator[Path]:
    """A new folder beside ``folder`` (``.<name>.<random>.tmp``) for the block to fill: when the block ends its
    files are fsynced and it takes ``folder``'s place (an old one is moved aside first, put back if the swap fails, removed once the new
    one is in place); when the block raises it is removed and ``folder`` stays as it was."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    staged = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f".{folder.name}.", suffix=".tmp"))
    try:
        yield staged
        share(staged)
        for path in (p for p in staged.rglob("*") if p.is_file()):  # on disk before the old folder goes
            with path.open("rb") as f:
                os.fsync(f.fileno())
        swap_in(staged, folder)
    finally:
        shutil.rmtree(staged, ignore_errors=True)  # gone already once swapped in


def swap_in(staged: Path, folder: Path) -> None:
    """Rename the finished ``staged`` folder to ``folder``. rename(2) replaces an empty folder itself; a folder
    with files is moved aside first (two renames: a kill between them leaves it as ``.<name>.<random>.old``)."""
    if holds(folder):
        old = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f".{folder.name}.", suffix=".old"))
        os.replace(folder, old)
        try:
            os.replace(staged, folder)
        except BaseException:
            os.replace(old, folder)
            raise
        shutil.rmtree(old)
    else:
        os.replace(staged, folder)
    fsync_folder(folder.parent)


def fsync_folder(folder: Path) -> None:
    """Make the renames in ``folder`` durable (a rename lives in the folder's entry, not in the file)."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
