#!/bin/bash
# The collapse study on this machine (PROTOCOL.md): the warm start, then seeds 0-2 × filter top_p | none, one
# run after another (pair by pair), each resuming from its own last.ckpt, so a stage can stop anywhere (STAGE_S seconds of
# runs, default 2.5 h) and the next stage continues where it stopped. Needs ragen2 installed (the README's
# command 1). After each stage:
#   STUDY=outputs/collapse_study bash results/collapse_study/collect.sh   (the finished runs' files, as committed)
#   ragen2-aggregate results/collapse_study/runs --pair filter=top_p,none --out results/collapse_study
#   python results/collapse_study/analyze.py results/collapse_study/runs --out results/collapse_study
#                                   (criteria (a), (b2), (b3), (c); both read the committed copies)
#   STUDY=outputs/collapse_study STAGE_S=9000 bash results/collapse_study/run.sh
# MODEL, FILTERS, SEEDS, DEMO_STEPS, DEMO_EPISODES and EXTRA (overrides for every run) exist for the tiny-scale test of this
# script (tests/integration/test_collapse_study.py) and the PPO pair (EXTRA=algo=ppo SEEDS=0); the study uses the
# defaults. FILTERS= (set, empty) builds the warm start and runs nothing.
set -euo pipefail
cd "$(dirname "$0")/../.."
STUDY=${STUDY:-outputs/collapse_study}
STAGE_S=${STAGE_S:-9000}
ITERATIONS=${ITERATIONS:-20}
MI_EVERY=${MI_EVERY:-4}
MODEL=${MODEL:-builtin}
FILTERS=${FILTERS-top_p none}
SEEDS=${SEEDS-0 1 2}
DEMO_STEPS=${DEMO_STEPS:-144}
DEMO_EPISODES=${DEMO_EPISODES:-1152}
read -ra EXTRA <<<"${EXTRA:-}"
PY=${PYTHON:-python}
ENV=(env=frozenlake env.kwargs.size=3 env.kwargs.p=0.8 env.kwargs.observation=coord max_turns_cap=5
  rollout.max_new_tokens=48)
WARM="$STUDY/warmstart/model"
[ -f "$WARM/warmstart.json" ] || "$PY" -m ragen2.warmstart "${ENV[@]}" model.name_or_path="$MODEL" \
  demos.episodes="$DEMO_EPISODES" sft.steps="$DEMO_STEPS" seed=0 hydra.run.dir="$STUDY/warmstart"
start=$(date +%s)
i=0
# pair by pair (seed 0's arms, then seed 1's, ...), so a stage that stops leaves whole pairs behind it
for seed in $SEEDS; do
  for filter in $FILTERS; do
    run="$STUDY/runs/$i"
    i=$((i + 1))
    [ -f "$run/done" ] && continue
    if (($(date +%s) - start >= STAGE_S)); then
      echo "stage over ($STAGE_S s): the next stage starts at $run" >&2
      exit 0
    fi
    ckpt=null
    [ -f "$run/checkpoints/last.ckpt" ] && ckpt=last
    mkdir -p "$run"
    timeout --signal=TERM "$((STAGE_S - ($(date +%s) - start)))" \
      "$PY" -m ragen2.train hydra.run.dir="$run" ckpt_path=$ckpt model.name_or_path="$WARM" "${ENV[@]}" \
      rollout.groups=4 rollout.group_size=8 algo.optim.lr=1e-5 algo.entropy_coef=0.01 algo.kl_coef=0 \
      iterations="$ITERATIONS" diagnostics.modes=[first_turn,trajectory] diagnostics.num_samples=64 \
      diagnostics.every_n_iterations="$MI_EVERY" callbacks.gradient_buckets.every_n_iterations="$MI_EVERY" \
      rollout.save_jsonl=true val.every_n_iterations="$ITERATIONS" val.num_seeds=64 val.samples=1 val.k=1 \
      filter=$filter seed=$seed "${EXTRA[@]}" >>"$run.log" 2>&1 || {
      status=$?
      ((status == 124 || status == 143)) && { echo "stage over: $run saved its iteration in progress" >&2; exit 0; }
      echo "$run failed (exit $status): $run.log" >&2
      exit "$status"
    }
    touch "$run/done"
  done
done
echo "every run is done: $STUDY/runs" >&2
