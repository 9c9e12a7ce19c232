#!/bin/bash
# The GPU run of the FrozenLake filter study: filter top_p | none × seeds 0-4, the built-in model, 8 groups × 8
# rollouts, on one GPU, runs side by side (each takes 8-9 GB: 6 fit in 80 GB; of the 10 started at once, 4
# ran out of memory at start-up). Every run is stopped at the wall clock and read at a common horizon:
#   SWEEP=multirun/fl_filter_gpu WALL=480 bash results/frozenlake_filter_gpu/run.sh
#   ragen2-aggregate $SWEEP --iterations 40 --every 2 --out results/frozenlake_filter_gpu
SWEEP=${SWEEP:-multirun/fl_filter_gpu}
WALL=${WALL:-480}
export OMP_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false
mkdir -p "$SWEEP"
i=0
pids=()
for filter in top_p none; do
  for seed in 0 1 2 3 4; do
    ragen2-train hydra.run.dir="$SWEEP/$i" \
      env=frozenlake max_turns_cap=2 rollout.groups=8 rollout.group_size=8 rollout.max_new_tokens=48 \
      algo.optim.lr=1e-5 diagnostics.every_n_iterations=2 diagnostics.num_samples=64 \
      val.every_n_iterations=5 val.num_seeds=32 val.samples=1 val.k=1 iterations=400 \
      trainer=gpu callbacks.checkpoint=null filter=$filter seed=$seed >"$SWEEP/$i.log" 2>&1 &
    pids+=($!)
    i=$((i + 1))
  done
done
sleep "$WALL"
kill -TERM "${pids[@]}" 2>/dev/null # metrics.csv holds every finished iteration (one row flushed per iteration)
wait
