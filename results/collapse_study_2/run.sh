#!/bin/bash
# The second collapse study (PROTOCOL.md): the first study's run.sh with every MI pass also scoring 16 held-out
# instances x 4 first turns and the learning rate LR, from the warm start whose sha256 PROTOCOL.md names.
#   pilot:  PILOT=1 LR=5e-5 bash results/collapse_study_2/run.sh    seed 0, filter=none: outputs/collapse_study_2_pilot_5e-5
#   study:  LR=<the pilot's> bash results/collapse_study_2/run.sh   seeds 1 2 3 x top_p, none: outputs/collapse_study_2
# WARMSTART=<a warm start's folder, e.g. outputs/collapse_study_ppo/warmstart> links it in instead of building
# one. Weights of another hash are refused (SHA256= empty skips the check: the tiny-scale test). STAGE_S and
# the other settings pass through to ../collapse_study/run.sh. After a pilot:
#   STUDY=outputs/collapse_study_2_pilot_5e-5 OUT=results/collapse_study_2/pilot/5e-5 bash results/collapse_study/collect.sh
#   python results/collapse_study_2/pilot.py results/collapse_study_2/pilot/5e-5/0 --out results/collapse_study_2/pilot
# After a stage of the study:
#   STUDY=outputs/collapse_study_2 OUT=results/collapse_study_2/runs bash results/collapse_study/collect.sh
#   python results/collapse_study/analyze.py results/collapse_study_2/runs --curve heldout --out results/collapse_study_2
set -euo pipefail
cd "$(dirname "$0")/../.."
: "${LR:?set LR: the learning rate the pilot of PROTOCOL.md names (5e-5 first)}"
SHA256=${SHA256-93745c0a7e4ed67e59370b220bd59136e2ade5e4f992210347c136ab5e5f1dcd}
if [ -n "${PILOT:-}" ]; then
  export STUDY=${STUDY:-outputs/collapse_study_2_pilot_$LR} SEEDS=0 FILTERS=none
else
  export STUDY=${STUDY:-outputs/collapse_study_2} SEEDS="${SEEDS-1 2 3}" FILTERS="${FILTERS-top_p none}"
fi
export EXTRA="algo.optim.lr=$LR diagnostics.heldout.num_seeds=16 diagnostics.heldout.samples=4 ${EXTRA:-}"
mkdir -p "$STUDY"
if [ -n "${WARMSTART:-}" ] && [ ! -e "$STUDY/warmstart" ]; then
  ln -s "$(realpath "$WARMSTART")" "$STUDY/warmstart"
fi
FILTERS= bash results/collapse_study/run.sh  # the warm start alone (built unless there), then its check
weights="$STUDY/warmstart/model/model.safetensors"
if [ -n "$SHA256" ] && [ "$(sha256sum "$weights" | cut -d' ' -f1)" != "$SHA256" ]; then
  echo "$weights is not the warm start PROTOCOL.md names (sha256 $SHA256): a pair's arms must start from the" \
    "same weights. Fix: WARMSTART=<the folder holding those weights>, or a protocol amendment naming the new hash" >&2
  exit 1
fi
exec bash results/collapse_study/run.sh
