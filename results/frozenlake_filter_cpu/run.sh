#!/bin/bash
# The CPU study: FrozenLake, the built-in model, filter top_p | none × seeds 0-4, through a SLURM cluster (the
# local one: slurm/local_cluster.sh), one job at a time on 2 cores (cpus_per_task=2; two jobs side by side
# thrash memory, 10-12 GB each). Run in stages: every job of a stage resumes from its last.ckpt
# (ckpt_path=auto), so the grid advances evenly and survives a killed job or a stopped session.
#   eval "$(bash slurm/local_cluster.sh start)"
#   ITERATIONS=4 bash results/frozenlake_filter_cpu/run.sh; ITERATIONS=8 bash results/frozenlake_filter_cpu/run.sh
#   ragen2-aggregate $SWEEP --keys filter --iterations 8 --every 1 --out results/frozenlake_filter_cpu
# (the committed results: seeds 0-3 to 4 iterations in 1 h 22 min on the cluster, then all ten to 8 in 1 h 36 min)
SWEEP=${SWEEP:-multirun/fl_filter_cpu}
exec ragen2-train --multirun \
  hydra/launcher=slurm hydra.launcher.partition=debug hydra.launcher.cpus_per_task=2 hydra.launcher.mem_gb=16 \
  hydra.launcher.gpus_per_node=null hydra.launcher.timeout_min=1440 hydra.sweep.dir="$SWEEP" \
  env=frozenlake max_turns_cap=2 rollout.groups=4 rollout.group_size=8 rollout.max_new_tokens=48 \
  algo.optim.lr=1e-5 diagnostics.every_n_iterations=2 diagnostics.num_samples=32 \
  val.every_n_iterations=4 val.num_seeds=16 val.samples=1 val.k=1 iterations="${ITERATIONS:-8}" \
  filter=top_p,none seed=0,1,2,3,4
