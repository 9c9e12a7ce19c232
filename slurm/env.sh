# Sourced by every SLURM job before srun (conf/hydra/launcher/slurm.yaml `setup`), and usable by hand:
#   source slurm/env.sh
# Put your cluster's `module load ...` lines at the end.
_ragen2_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
export RAGEN2_ROOT=${RAGEN2_ROOT:-$_ragen2_root}
# the venv that submitted the sweep (RAGEN2_VENV), else the repo's .venv
if [[ -f ${RAGEN2_VENV:-$_ragen2_root/.venv}/bin/activate ]]; then
  source "${RAGEN2_VENV:-$_ragen2_root/.venv}/bin/activate"
fi
unset _ragen2_root
# compute nodes often have no internet: nothing downloads at run time, wandb logs offline (`wandb sync` later)
export HF_HUB_OFFLINE=${HF_HUB_OFFLINE:-1}
export TRANSFORMERS_OFFLINE=${TRANSFORMERS_OFFLINE:-1}
export WANDB_MODE=${WANDB_MODE:-offline}
export TOKENIZERS_PARALLELISM=false
# unbuffered Python: the job log (.submitit/<job>/*_log.out) shows progress as it happens
export PYTHONUNBUFFERED=1
if [[ -n ${SLURM_JOB_ID:-} ]]; then
  echo "[ragen2] SLURM_JOB_ID=$SLURM_JOB_ID (array ${SLURM_ARRAY_JOB_ID:-none}_${SLURM_ARRAY_TASK_ID:-}) on $(hostname), restart ${SLURM_RESTART_COUNT:-0}"
fi
