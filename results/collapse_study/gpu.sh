#!/bin/bash
# The collapse study's GPU version (PROTOCOL.md at a larger scale): 8 groups x 16 rollouts, 150 iterations, the
# MI pass and gradient buckets every 10 (with the held-out curve: 16 instances x 4 first turns, amendment 4),
# validation on 64 seeds every 50; filter top_p | none x seeds 0-2 (and
# the PPO pair with PAIRS_PPO=1) side by side on one GPU (about 9 GB each). It runs in chunks of at most
# CHUNK_S seconds (default 540, for 10-minute device calls): every run gets SIGTERM at the chunk's end, saves
# the iteration in progress and exits 143; the next call resumes each from its last.ckpt. Call it until it
# prints "every run is done", then aggregate as run.sh says. Needs ragen2 installed with its model
# (scripts/install.sh with RAGEN2_DEVICE=cuda) and the warm start, which the first call makes on the GPU.
#   STUDY=outputs/collapse_study_gpu bash results/collapse_study/gpu.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
STUDY=${STUDY:-outputs/collapse_study_gpu}
CHUNK_S=${CHUNK_S:-540}
ITERATIONS=${ITERATIONS:-150}
PY=${PYTHON:-python}
export OMP_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false
ENV=(env=frozenlake env.kwargs.size=3 env.kwargs.p=0.8 env.kwargs.observation=coord max_turns_cap=5
  rollout.max_new_tokens=48)
WARM="$STUDY/warmstart/model"
start=$(date +%s)
[ -f "$WARM/warmstart.json" ] || "$PY" -m ragen2.warmstart "${ENV[@]}" demos.episodes=1152 sft.steps=144 seed=0 \
  trainer.precision=bf16-mixed hydra.run.dir="$STUDY/warmstart" || exit 1
arms=("algo=grpo filter=top_p seed=0" "algo=grpo filter=top_p seed=1" "algo=grpo filter=top_p seed=2"
  "algo=grpo filter=none seed=0" "algo=grpo filter=none seed=1" "algo=grpo filter=none seed=2")
[ "${PAIRS_PPO:-0}" = 1 ] && arms+=("algo=ppo filter=top_p seed=0" "algo=ppo filter=none seed=0")
pids=()
for i in "${!arms[@]}"; do
  run="$STUDY/runs/$i"
  [ -f "$run/done" ] && continue
  ckpt=null
  [ -f "$run/checkpoints/last.ckpt" ] && ckpt=last
  mkdir -p "$run"
  # shellcheck disable=SC2086 # an arm is several overrides
  ("$PY" -m ragen2.train hydra.run.dir="$run" ckpt_path=$ckpt model.name_or_path="$WARM" "${ENV[@]}" \
    trainer=gpu rollout.groups=8 rollout.group_size=16 algo.optim.lr=1e-5 algo.entropy_coef=0.01 \
    algo.kl_coef=0 iterations="$ITERATIONS" diagnostics.modes=[first_turn,trajectory] \
    diagnostics.num_samples=64 diagnostics.every_n_iterations=10 callbacks.gradient_buckets.every_n_iterations=10 \
    diagnostics.heldout.num_seeds=16 diagnostics.heldout.samples=4 \
    rollout.save_jsonl=true val.every_n_iterations=50 val.num_seeds=64 val.samples=4 val.k=1 ${arms[$i]} \
    >>"$run.log" 2>&1 && touch "$run/done") &
  pids+=($!)
done
((${#pids[@]} == 0)) && { echo "every run is done: $STUDY/runs" >&2; exit 0; }
left=$((CHUNK_S - ($(date +%s) - start)))
( sleep "$((left > 30 ? left : 30))"; pkill -TERM -f "ragen2.train hydra.run.dir=$STUDY/runs/" ) &
wait "${pids[@]}"
echo "chunk over: $(ls "$STUDY"/runs/*/done 2>/dev/null | wc -l) of ${#arms[@]} runs done; call again to go on" >&2
