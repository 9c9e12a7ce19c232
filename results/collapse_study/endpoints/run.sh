#!/bin/bash
# The supplement's 64-row MI passes (PROTOCOL.md beside this file): ragen2-diagnose on the warm start and on
# each study run's last.ckpt, with the study's setting, 16 held-out instances × 4 first-turn samples, at
# seeds 0 and 1. A pass whose metrics.json exists is skipped, so it can stop and go on. Then:
#   python results/collapse_study/endpoints/criteria.py "$STUDY/endpoints" --out results/collapse_study/endpoints
set -euo pipefail
cd "$(dirname "$0")/../../.."
STUDY=${STUDY:-outputs/collapse_study}
RUNS=${RUNS:-0 1 2 3 4 5}
SEEDS=${SEEDS:-0 1}
PY=${PYTHON:-python}
WARM="$STUDY/warmstart/model"
ENV=(env=frozenlake env.kwargs.size=3 env.kwargs.p=0.8 env.kwargs.observation=coord max_turns_cap=5
  rollout.max_new_tokens=48 num_seeds=16 samples=4)
models=(warmstart)
for r in $RUNS; do models+=("$r"); done
for model in "${models[@]}"; do
  ckpt=null
  [ "$model" = warmstart ] || ckpt="$STUDY/runs/$model/checkpoints/last.ckpt"
  for seed in $SEEDS; do
    out="$STUDY/endpoints/$model/seed$seed"
    [ -f "$out/metrics.json" ] && continue
    "$PY" -m ragen2.diagnose model.name_or_path="$WARM" checkpoint="$ckpt" "${ENV[@]}" seed="$seed" \
      hydra.run.dir="$out.hydra" output="$out"
  done
done
echo "every pass is done: $STUDY/endpoints" >&2
