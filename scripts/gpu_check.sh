#!/usr/bin/env bash
# The GPU check in one call (at most 10 minutes on one GPU): the gpu-marked tests, the decode step against
# the bandwidth bound on Qwen2.5-3B's shape, ragen2-eval on the GPU and bench_gpu's training iterations;
# writes bench/results/gpu.json (bench/gpu_check.py says what each step runs).
# Runs in the current Python. Where ragen2 is not installed (a machine with torch, transformers and
# lightning but no network), it runs from the source tree, and missing pure-Python packages (hydra-core,
# omegaconf, antlr4-python3-runtime, gymnasium, farama-notifications) install from the wheels in
# $RAGEN2_WHEELS (default .whl/) into a temporary folder; the tiny model's tokenizer folder comes from
# $RAGEN2_CACHE as training builds it (docs/development.md: "The GPU check").
# Arguments go to bench/gpu_check.py, e.g. --skip bench_gpu or --decode-baseline none.
set -euo pipefail
cd "$(dirname "$0")/.."
py="${PYTHON:-python3}"
if ! "$py" -c "import ragen2, ragen2_envs" 2>/dev/null; then
  export PYTHONPATH="$PWD/src:$PWD/envs${PYTHONPATH:+:$PYTHONPATH}"
fi
if ! "$py" -c "import hydra, omegaconf, gymnasium" 2>/dev/null; then
  wheels="${RAGEN2_WHEELS:-.whl}"
  if ! compgen -G "$wheels/*.whl" >/dev/null; then
    echo "hydra-core, omegaconf or gymnasium is missing and $wheels holds no wheels. Fix: pip install -e . (or put their wheels in RAGEN2_WHEELS)" >&2
    exit 2
  fi
  site="$(mktemp -d)"
  "$py" -m pip install -q --no-index --no-deps --no-compile --target "$site" "$wheels"/*.whl
  export PYTHONPATH="$site:${PYTHONPATH:-}"
fi
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
exec "$py" bench/gpu_check.py "$@"
