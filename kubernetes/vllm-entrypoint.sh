#!/usr/bin/env bash
# vLLM container entrypoint for the hang-watchdog sidecar deployment.
#
#   vllm-entrypoint.sh COMMAND [ARGS...]      e.g. vllm-entrypoint.sh vllm serve MODEL --port 8000
#
# 1. Copies stdout and stderr to HANG_WATCHDOG_LOG_FILE (default /shared/logs/vllm.log) for the
#    watchdog's log source, still printing them so `kubectl logs` works. The file is rotated to
#    .1 when it exceeds HANG_WATCHDOG_LOG_MAX_BYTES (default 100 MiB). Set it empty to skip.
# 2. Applies the fallback the watchdog wrote into the shared volume (HANG_WATCHDOG_FALLBACK_FILE,
#    default /shared/hang-watchdog/fallback.env): HANG_WATCHDOG_FALLBACK_ARGS="..." is appended
#    to the command, every other KEY=VALUE line (e.g. NCCL_NVLS_ENABLE=0) is exported. The old
#    name VLLM_WATCHDOG_ARGS (the watchdog writes both, same value) is used only when the file
#    has no HANG_WATCHDOG_FALLBACK_ARGS line, i.e. when an older watchdog wrote it. The file is read
#    as data, never sourced, so nothing in it can run as code. A bad line is reported and skipped.
# 3. execs the command, so the server is the container's main process: the kubelet's SIGTERM
#    reaches it directly, and when the watchdog terminates it the container exits and restarts.
set -euo pipefail

fallback_file="${HANG_WATCHDOG_FALLBACK_FILE:-/shared/hang-watchdog/fallback.env}"
log_file="${HANG_WATCHDOG_LOG_FILE:-/shared/logs/vllm.log}"
log_max_bytes="${HANG_WATCHDOG_LOG_MAX_BYTES:-104857600}"

if [[ $# -eq 0 ]]; then
    echo "vllm-entrypoint: usage: vllm-entrypoint.sh COMMAND [ARGS...]" \
        "(e.g. vllm serve MODEL --port 8000)" >&2
    exit 2
fi

if [[ -n "$log_file" ]]; then
    mkdir -p "$(dirname "$log_file")"
    # Line-buffered tee with size-based rotation; python3 is in every vLLM image.
    exec > >(python3 -u -c '
import os, sys
path, limit = sys.argv[1], int(sys.argv[2])
out = open(path, "ab", buffering=0)
for line in iter(sys.stdin.buffer.readline, b""):
    sys.stdout.buffer.write(line)
    out.write(line)
    if out.tell() > limit:
        out.close()
        os.replace(path, path + ".1")
        out = open(path, "ab", buffering=0)
' "$log_file" "$log_max_bytes") 2>&1
fi

extra_args=()
old_args=()
have_new=0
applied=()
if [[ -r "$fallback_file" ]]; then
    lineno=0
    while IFS= read -r line || [[ -n "$line" ]]; do
        lineno=$((lineno + 1))
        line="${line%$'\r'}"
        [[ -z "${line//[[:space:]]/}" || "$line" =~ ^[[:space:]]*# ]] && continue
        if [[ ! "$line" =~ ^[[:space:]]*([A-Za-z_][A-Za-z0-9_]*)=(.*)$ ]]; then
            echo "vllm-entrypoint: $fallback_file:$lineno: not KEY=VALUE, ignored: $line" >&2
            continue
        fi
        key="${BASH_REMATCH[1]}"
        value="${BASH_REMATCH[2]}"
        # One pair of surrounding quotes, as in a systemd EnvironmentFile.
        if [[ "$value" =~ ^\"(.*)\"$ || "$value" =~ ^\'(.*)\'$ ]]; then
            value="${BASH_REMATCH[1]}"
        fi
        if [[ "$key" == "HANG_WATCHDOG_FALLBACK_ARGS" ]]; then
            # Split on whitespace only: no globbing, no expansion.
            read -r -a words <<< "$value"
            extra_args+=("${words[@]}")
            have_new=1
        elif [[ "$key" == "VLLM_WATCHDOG_ARGS" ]]; then
            read -r -a words <<< "$value"
            old_args+=("${words[@]}")
        else
            export "$key=$value"
        fi
        applied+=("$key=$value")
    done < "$fallback_file"
    if [[ $have_new -eq 0 ]]; then
        extra_args+=("${old_args[@]}")
    fi
fi
if [[ ${#applied[@]} -gt 0 ]]; then
    echo "vllm-entrypoint: hang-watchdog fallback applied from $fallback_file: ${applied[*]}" >&2
fi

exec "$@" "${extra_args[@]}"
