#!/usr/bin/env bash
# README command 2: install, then run every test except the gpu-marked ones (slow ones included): first the
# fast stage (lint, format, types), then the suite.
# Extra arguments go to pytest, e.g. scripts/test.sh tests/unit -x.
# --fast (first argument) is the quick loop while developing: the tests marked neither slow nor gpu, in the
# virtualenv as it is when one is there (no install, no apt, no lint stage); arguments after it are added.
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${RAGEN2_VENV:-.venv}"
fast=false
if [ "${1:-}" = --fast ]; then
  fast=true
  shift
fi
if $fast && "$venv/bin/python" -c "import ragen2, ragen2_envs, pytest, xdist" 2>/dev/null; then
  echo "--fast: using the virtualenv in $venv as it is (scripts/install.sh brings it up to date)"
else
  bash scripts/install.sh
fi
# a real SLURM cluster on localhost for the launcher tests, bubblewrap for the DeepCoder sandbox
# (root with apt only; their tests skip elsewhere, the sandbox's falling back to `unshare`)
if ! $fast && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null && ! { command -v slurmctld && command -v bwrap; } >/dev/null; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurm-wlm bubblewrap >/dev/null
fi
# shellcheck disable=SC1091
. "$venv/bin/activate"
args=("$@")
if $fast; then
  echo "the quick loop: every test marked neither slow nor gpu"
  args=(-m "not slow and not gpu" "$@")
elif [ ${#args[@]} -eq 0 ]; then
  # the fast first stage: lint, format and the type check fail within a minute or two, before the suite
  echo "stage 1: ruff check, ruff format --check, the type check"
  ruff check src envs tests bench docs && ruff format --check src envs tests bench && python -m pytest -q -p no:cacheprovider tests/test_types.py || exit 1
  echo "stage 2: every test but the gpu-marked ones"
  args=(-m "not gpu" --deselect tests/test_types.py::test_the_library_type_checks)
fi
# glibc's malloc serves blocks over its threshold (128 KiB, rising to at most 32 MiB) with mmap and gives
# them back to the kernel when freed, so each step of the tests' many small runs page-faults its activations
# in again: the kernel's share of the suite's CPU time was about a seventh. Keeping freed memory in the
# process (allocations up to 1 GiB from the heap, trimmed above 4 GiB) cost test_loop.py 0.4 GiB more at
# its peak (docs/development.md#tests); C libraries other than glibc ignore the setting.
export GLIBC_TUNABLES="${GLIBC_TUNABLES:+$GLIBC_TUNABLES:}glibc.malloc.mmap_threshold=1073741824:glibc.malloc.trim_threshold=4294967296"
# one pytest-xdist worker per core, at most one per 6 GiB of memory (a worker holding the built-in model, a
# vLLM engine or two ranks peaks near that); RAGEN2_TEST_WORKERS overrides, and -n in the arguments wins.
# loadfile: a file runs on one worker, and the files that share a cluster, two ranks or a vLLM engine run on
# one worker together (tests/conftest.py)
workers="${RAGEN2_TEST_WORKERS:-$(python -c 'import os; print(max(1, min(len(os.sched_getaffinity(0)), os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // (6 * 2**30))))')}"
set +e
python -m pytest -n "$workers" --dist loadfile "${args[@]}" --durations=25 -p no:cacheprovider
status=$?
set -e
if [ "$status" -eq 5 ]; then
  echo "no tests were collected: failing" >&2
  exit 1
fi
exit "$status"
