"""Keep secrets out of everything the watchdog writes: environments, command lines, log tails.

Two nets: names that say "secret" (HF_TOKEN, VLLM_API_KEY, --api-key) lose their values, and
values that look like credentials (hf_..., sk-..., ghp_..., AKIA..., JWTs, long high-entropy
strings) are replaced wherever they appear. Hex digests (cubin sha256, artifact pins) and GPU
UUIDs are evidence, so pure hex is never treated as a secret.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

SECRET_NAME_PARTS = ("TOKEN", "KEY", "SECRET", "PASSWORD", "CREDENTIAL")
RELEVANT_ENV_PREFIXES = (
    "VLLM_",
    "FLASHINFER_",
    "NCCL_",
    "CUDA_",
    "TORCH_",
    "HF_",
    "PYTORCH_",
    "NVIDIA_",
)
REDACTED = "<redacted>"

# Well-known credential shapes, matched anywhere in text.
_TOKEN_PATTERNS = (
    r"hf_[A-Za-z0-9]{16,}",  # Hugging Face
    r"sk-[A-Za-z0-9_-]{16,}",  # OpenAI-style API keys (sk-..., sk-proj-...)
    r"gh[pousr]_[A-Za-z0-9]{20,}",  # GitHub tokens
    r"github_pat_[A-Za-z0-9_]{20,}",
    r"(?:AKIA|ASIA)[0-9A-Z]{16}",  # AWS access key ids
    r"xox[abprs]-[A-Za-z0-9-]{10,}",  # Slack
    r"eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}",  # JWT
)
_TOKEN_RE = re.compile(r"(?<![A-Za-z0-9])(?:" + "|".join(_TOKEN_PATTERNS) + r")")
_BEARER_RE = re.compile(r"(?i)\b(bearer|basic)\s+[A-Za-z0-9._~+/=-]{8,}")
_URL_CRED_RE = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^\s/@:]+:[^\s/@]+@")
# `--api-key X`, `--hf-token=X`, `HF_TOKEN=X`, `"password": "X"`: a name with a secret word as
# one of its parts (so --max-num-batched-tokens and --tokenizer are left alone), then a value.
# Only options (leading dashes) may take their value after a space.
_SECRET_WORD = r"(?:[A-Za-z0-9]+[-_.])*(?:token|key|apikey|secret|password|passwd|credentials?)"
_NAME = _SECRET_WORD + r"(?:[-_.][A-Za-z0-9]+)*"
_VALUE = r"([\"']?)([^\s\"',;]+)"
_OPTION_RE = re.compile(r"(?i)(?<![\w-])(--?" + _NAME + r")(=|\s+)" + _VALUE)
_ASSIGN_RE = re.compile(r"(?i)(?<![\w-])(" + _NAME + r")([\"']?\s*[=:]\s*)" + _VALUE)
# A standalone word of key characters; words joined to identifiers, file names or paths by `_`,
# `.`, `-` or a leading `/` are kernel names and paths (evidence), not keys.
_BLOB_RE = re.compile(r"(?<![\w.\-/])[A-Za-z0-9+/=]{32,}(?![\w.\-])")
_HEX_RE = re.compile(r"[0-9a-fA-F]+")
_HARMLESS_RE = re.compile(r"(?i)[0-9.]+|none|null|true|false|\[\]|\{\}|\(\)")


def is_secret_name(name: str) -> bool:
    """True when an environment variable's name says it holds a secret."""
    upper = name.upper()
    return any(part in upper for part in SECRET_NAME_PARTS)


def redact_environ(env: Mapping[str, str]) -> dict[str, str]:
    """A copy of `env` with secret names' values replaced and token-like values removed."""
    return {k: REDACTED if is_secret_name(k) else redact_text(v) for k, v in env.items()}


def relevant_environ(env: Mapping[str, str]) -> dict[str, str]:
    """The variables that matter for a hang report (vLLM, FlashInfer, NCCL, CUDA...), redacted."""
    return redact_environ({k: v for k, v in env.items() if k.startswith(RELEVANT_ENV_PREFIXES)})


def redact_text(text: str) -> str:
    """`text` with credential-looking values replaced by <redacted>."""
    text = _URL_CRED_RE.sub(lambda m: m.group(1) + REDACTED + "@", text)
    text = _BEARER_RE.sub(lambda m: f"{m.group(1)} {REDACTED}", text)
    text = _OPTION_RE.sub(_named, text)
    text = _ASSIGN_RE.sub(_named, text)
    text = _TOKEN_RE.sub(REDACTED, text)
    return _BLOB_RE.sub(_blob, text)


def redact_tree(obj: Any) -> Any:
    """Every string in a JSON-like tree (dicts, lists) passed through redact_text."""
    if isinstance(obj, str):
        return redact_text(obj)
    if isinstance(obj, Mapping):
        return {
            k: REDACTED if isinstance(v, str) and _secret_key(k) else redact_tree(v)
            for k, v in obj.items()
        }
    if isinstance(obj, (list, tuple)):
        if obj and all(isinstance(v, str) for v in obj):
            return redact_argv(obj)
        return [redact_tree(v) for v in obj]
    return obj


def redact_argv(argv: Sequence[str]) -> list[str]:
    """A command line as a list: `--api-key VALUE` spans two items, so the item after a
    secret-named option is redacted too (unless it is the next option or a plain number)."""
    out: list[str] = []
    hide = False
    for arg in argv:
        if hide and not arg.startswith("-") and not _HARMLESS_RE.fullmatch(arg):
            out.append(REDACTED)
        else:
            out.append(redact_text(arg))
        hide = _secret_option(arg)
    return out


# The last word of an option that takes a secret as its value (`--api-key`, `--hf-token`).
# Flags whose name merely mentions one (`--allow-credentials`, `--return-tokens-as-token-ids`)
# take no value: hiding the item after them would hide the model name.
_SECRET_LAST_WORDS = frozenset(
    {"key", "apikey", "token", "secret", "password", "passwd", "credential", "pat"}
)


def _secret_option(arg: str) -> bool:
    if not arg.startswith("-") or "=" in arg or arg in ("-", "--"):
        return False
    return re.split(r"[-_.]", arg.lstrip("-").lower())[-1] in _SECRET_LAST_WORDS


def _secret_key(key: object) -> bool:
    return isinstance(key, str) and key.isupper() and is_secret_name(key)


def _named(m: re.Match[str]) -> str:
    value = m.group(4)
    if value.startswith(("<redacted", "-")) or _HARMLESS_RE.fullmatch(value):
        return m.group(0)  # the next option, a count ("token: 8192") or a null, not a secret
    return f"{m.group(1)}{m.group(2)}{m.group(3)}{REDACTED}"


def _blob(m: re.Match[str]) -> str:
    s = m.group(0)
    if _HEX_RE.fullmatch(s) or not _looks_random(s):
        return s
    return REDACTED


def _looks_random(s: str) -> bool:
    """Mixed case and digits with high per-character entropy: a key, not a word or identifier."""
    if not (any(c.islower() for c in s) and any(c.isupper() for c in s)):
        return False
    if sum(c.isdigit() for c in s) < 2:
        return False
    counts = Counter(s)
    entropy = -sum(n / len(s) * math.log2(n / len(s)) for n in counts.values())
    return entropy >= 4.0
