#!/bin/bash
# After a stage: copies each finished run (a `done` file) of $STUDY/runs into $OUT/<n>, as committed: .hydra/,
# csv/metrics.csv, train.log, curves.png, the gradient figures and every episode gzipped
# (rollouts.rank0.jsonl.gz); the checkpoints, TensorBoard files and per-iteration markdown stay behind. A run
# already collected is left as it is; a run without `done` (cut by its stage) is not collected.
#   STUDY=outputs/collapse_study bash results/collapse_study/collect.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
STUDY=${STUDY:-outputs/collapse_study}
OUT=${OUT:-results/collapse_study/runs}
for run in "$STUDY"/runs/*/; do
  run=${run%/}
  dst="$OUT/$(basename "$run")"
  [ -f "$run/done" ] && [ ! -f "$dst/rollouts.rank0.jsonl.gz" ] || continue
  mkdir -p "$dst"
  cp -r "$run/.hydra" "$run/csv" "$run/train.log" "$run/curves.png" "$run/gradients" "$dst/"
  gzip -c "$run/rollouts.rank0.jsonl" >"$dst/rollouts.rank0.jsonl.gz.part"
  mv "$dst/rollouts.rank0.jsonl.gz.part" "$dst/rollouts.rank0.jsonl.gz"  # whole or absent: the skip above reads it
  echo "$dst"
done
