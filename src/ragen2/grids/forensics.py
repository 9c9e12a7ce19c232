"""Why a job failed, from what submitit left of it: ``.submitit/<job>/`` folders, their logs and result files.

A result file (``<job>_<task>_result.pkl``) is submitit's pickle of ``("success", result)`` or ``("error",
traceback text)``; under Hydra's launchers the result is Hydra's ``JobReturn``, which holds a task's
exception when the task raised. A pickle runs whatever code its globals name, and the grid's folder is
shared, so by default a result is read by ``RecordUnpickler``: every global becomes an inert ``Record``
of its name, arguments and state, and only those are read. ``trust_pickles`` unpickles it in full.
"""

from __future__ import annotations

import pickle
import re
from pathlib import Path
from typing import Any, TypeGuard

from hydra.core.utils import JobReturn, JobStatus

_EXCEPTION = re.compile(r"^[\w.]*(?:Error|Exception|Interrupt|Exit)(?::.*)?$", re.MULTILINE)
_SLURM_END = re.compile(r"\*\*\* (?:JOB|STEP) \S+ ON \S+ CANCELLED.*\*\*\*")
_JOB_RETURN = f"{JobReturn.__module__}.{JobReturn.__qualname__}"
_JOB_STATUS = f"{JobStatus.__module__}.{JobStatus.__qualname__}"
NOT_READABLE = "result not readable without --trust-pickles"


def submitit_folders(grid: Path) -> dict[str, Path]:
    """Job id -> its folder (``.submitit/<id>/``, with a pickle or a log; an array's own folder has neither)."""
    root = grid / ".submitit"
    folders = sorted(p for p in root.iterdir() if p.is_dir()) if root.is_dir() else []
    return {p.name: p for p in folders if any(p.glob("*_submitted.pkl")) or any(p.glob("*_log.*"))}


def log_problem(text: str) -> str | None:
    """What a submitit job log says went wrong; None when its last verdict is 'Job completed successfully'."""
    ok = text.rfind("Job completed successfully")
    raised = text.rfind("Submitted job triggered an exception")
    if ok > raised:
        return None
    if raised >= 0:
        lines = _EXCEPTION.findall(text)
        return _short(lines[-1] if lines else "the job raised an exception (see its log)")
    slurm = _SLURM_END.findall(text)
    return (
        slurm[-1] if slurm else "the job's log ends without a verdict (still running, killed, out of memory?)"
    )


class _Inert(type):
    """The metaclass of records: calling a record (pickle's REDUCE) records the call instead of running one.

    A record is a class, so what each one holds is declared here, on the class of records (see ``Record``).
    """

    name: str | None  # a global's "module.qualname"; None for what a call made
    made_by: _Inert | None
    args: tuple[Any, ...]
    state: Any

    def __call__(cls, *args: Any, **kwargs: Any) -> _Inert:
        return _record(None, cls, args)

    def __setitem__(cls, key: Any, value: Any) -> None:
        """A mapping a global built is filled (a defaultdict): its contents are never read."""


class Record(metaclass=_Inert):
    """What a pickle names or builds through a global, as data: nothing the pickle names is imported or run.

    A global (a class, a function) is a record with its ``name``; calling one, or creating an instance of
    one, gives a record ``made_by`` it with the call's ``args``; ``state`` is what the pickle would have set
    on it after. Records are classes because the pickle may create instances of what a call returned
    (cloudpickle's classes by value), and the unpickler creates instances of classes only.
    """

    def __new__(cls, *args: Any, **kwargs: Any) -> _Inert:
        return _record(None, cls, args)

    @classmethod
    def __setstate__(cls, state: Any) -> None:
        cls.state = state

    @classmethod
    def extend(cls, values: Any) -> None:  # pickle's APPEND(S) prefer extend to append
        """A sequence a global built is filled (a list subclass): its contents are never read."""


def _record(name: str | None, made_by: _Inert | None, args: tuple[Any, ...]) -> _Inert:
    record = _Inert.__new__(_Inert, "Record", (Record,), {})
    record.name, record.made_by, record.args, record.state = name, made_by, args, None
    return record


class RecordUnpickler(pickle.Unpickler):
    """An unpickler that imports nothing: each global the pickle names is a ``Record`` of that name."""

    def find_class(self, module: str, name: str) -> _Inert:
        return _record(f"{module}.{name}", None, ())


def _made_by(value: Any, name: str) -> TypeGuard[_Inert]:
    return isinstance(value, _Inert) and value.made_by is not None and value.made_by.name == name


def _raised(traceback: str) -> str:
    lines = _EXCEPTION.findall(traceback)
    return lines[-1] if lines else "the job raised an exception (see its log)"


def _object_problem(outcome: Any) -> str | None:
    """What submitit's outcome, unpickled in full, says went wrong."""
    status, value = outcome
    if status == "error":
        return _raised(str(value))
    if getattr(getattr(value, "status", None), "name", None) == "FAILED":
        error = value._return_value  # its return_value property would raise it (and print to stderr)
        return f"{type(error).__name__}: {error}"
    return None


def _record_problem(outcome: Any) -> str | None:
    """What submitit's outcome, read as records, says went wrong; NOT_READABLE where records cannot tell."""
    match outcome:
        case ("error", str(traceback)):
            return _raised(traceback)
        case ("success", value) if not _made_by(value, _JOB_RETURN):
            return None
        case ("success", value) if isinstance(value.state, dict):
            status, error = value.state.get("status"), value.state.get("_return_value")
            if not (_made_by(status, _JOB_STATUS) and status.args == (JobStatus.FAILED.value,)):
                return None
            if isinstance(error, _Inert) and error.made_by is not None and error.made_by.name is not None:
                # BaseException's own str() of the arguments: a class's own __str__ would have to run
                args = error.args
                text = "" if not args else str(args[0]) if len(args) == 1 else str(args)
                return f"{error.made_by.name.rpartition('.')[2]}: {text}"
    return NOT_READABLE  # not submitit's format, or an exception class the pickle builds by value


def result_problem(path: Path, trust_pickles: bool = False) -> str | None:
    """What a submitit result file says went wrong: submitit's own ("error", traceback), or a failure Hydra
    caught; read as records, or unpickled in full with ``trust_pickles`` (which runs the code it names).

    Hydra's ``run_job`` catches the task's exception into its ``JobReturn`` (status FAILED), so submitit
    logs "Job completed successfully" for a job that raised: only the result holds the error.
    """
    with path.open("rb") as f:
        if trust_pickles:
            return _object_problem(pickle.load(f))  # how submitit's launching process reads it
        return _record_problem(RecordUnpickler(f).load())


def _short(text: str, limit: int = 300) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _log_text(folder: Path) -> str | None:
    logs = sorted(folder.glob("*_log.out")) + sorted(folder.glob("*_log.err"))
    return "\n".join(p.read_text(errors="replace") for p in logs) if logs else None


def job_problem(folder: Path, trust_pickles: bool = False) -> str | None:
    """What a submitit job folder says went wrong: its results when they read, else its log."""
    results = sorted(folder.glob("*_result.pkl"))  # one per task
    try:
        problems = [result_problem(path, trust_pickles) for path in results]
    except Exception:  # unreadable (truncated; in full, a class that no longer imports): the log still tells
        problems = []
    if problems:
        return next((_short(p) for p in problems if p is not None), None)
    text = _log_text(folder)
    return None if text is None else log_problem(text)
