"""Secrets never survive redaction; evidence (hashes, kernel names, counts) always does."""

from __future__ import annotations

from pathlib import Path

import pytest

from watchdog.core.redact import (
    REDACTED,
    RELEVANT_ENV_PREFIXES,
    SECRET_NAME_PARTS,
    redact_environ,
    redact_text,
    redact_tree,
    relevant_environ,
)

DATA = Path(__file__).parent / "data"
HF = "hf_" + "AbCdEfGhIjKlMnOpQrStUvWxYz012345"
SECRETS = [
    HF,
    "sk-proj-" + "Zz9Yy8Xx7Ww6Vv5Uu4Tt3Ss2",
    "ghp_" + "0123456789abcdefABCDEF0123456789abcd",
    "AKIA" + "IOSFODNN7EXAMPLE",
    "eyJhbGciOiJIUzI1NiJ9"
    + ".eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
    "q8Zr2LmXv9TpWc4NbYs7HdKf3GjRe6Ua",  # 32 random characters, no known prefix
]


@pytest.mark.parametrize("secret", SECRETS)
def test_token_like_values_are_redacted_anywhere_in_text(secret: str) -> None:
    text = f"INFO starting with credential {secret} in the middle"
    out = redact_text(text)
    assert secret not in out
    assert REDACTED in out
    assert out.startswith("INFO starting with credential")


@pytest.mark.parametrize(
    ("text", "secret"),
    [
        ("vllm serve m --api-key abc123notaprefix --port 8000", "abc123notaprefix"),
        ("vllm serve m --hf-token=plainvalue", "plainvalue"),
        ("HF_TOKEN=whatever python -m vllm", "whatever"),
        ('{"password": "hunter2"}', "hunter2"),
        ("Authorization: Bearer opaque.value-123", "opaque.value-123"),
        ("https://alice:s3cr3t@mirror.example/simple", "s3cr3t"),
    ],
)
def test_values_under_secret_names_are_redacted(text: str, secret: str) -> None:
    assert secret not in redact_text(text)


@pytest.mark.parametrize(
    "text",
    [
        "--max-num-batched-tokens 8192 --tokenizer meta-llama/Llama-3-8B",
        "sha256 0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
        "GPU-5f8e3b2a-1c2d-4e5f-8a9b-0c1d2e3f4a5b",
        "Qwen3-235B-A22B-Instruct-2507-FP8",
        "prompt_tokens: 123, stop_token_ids=[], api_key=None",
        "--api-key --port 8000",
    ],
)
def test_evidence_is_left_alone(text: str) -> None:
    assert redact_text(text) == text


@pytest.mark.parametrize(
    "name",
    ["a_fi4985_cubin_fetch_lock.log", "a_fi1728_cubin_sha256_mismatch.log"],
)
def test_real_flashinfer_logs_keep_their_hashes_and_kernel_names(name: str) -> None:
    text = (DATA / name).read_text()
    assert redact_text(text) == text


def test_redact_environ_by_name_and_by_value() -> None:
    env = {
        "HF_TOKEN": "x",
        "MY_API_KEY": "y",
        "DB_PASSWORD": "z",
        "AWS_SECRET_ACCESS_KEY": "w",
        "SOME_CREDENTIALS_FILE": "/etc/c",
        "INNOCENT": HF,
        "CUDA_VISIBLE_DEVICES": "0,1",
    }
    out = redact_environ(env)
    for name in SECRET_NAME_PARTS:
        assert any(name in k for k in out)  # every secret word is exercised above
    assert {k for k, v in out.items() if v == REDACTED} == {
        "HF_TOKEN",
        "MY_API_KEY",
        "DB_PASSWORD",
        "AWS_SECRET_ACCESS_KEY",
        "SOME_CREDENTIALS_FILE",
        "INNOCENT",
    }
    assert out["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert env["HF_TOKEN"] == "x"  # the input is not modified


def test_relevant_environ_keeps_known_prefixes_only() -> None:
    env = {"VLLM_API_KEY": "k", "NCCL_DEBUG": "INFO", "HOME": "/root", "PATH": "/bin"}
    out = relevant_environ(env)
    assert out == {"VLLM_API_KEY": REDACTED, "NCCL_DEBUG": "INFO"}
    assert all(k.startswith(RELEVANT_ENV_PREFIXES) for k in out)


def test_redact_tree_walks_nested_data() -> None:
    tree = {"a": [f"tok {HF}", {"HF_TOKEN": "plain"}], "n": 3, "ok": "fine"}
    out = redact_tree(tree)
    assert HF not in str(out) and "plain" not in str(out)
    assert out["n"] == 3 and out["ok"] == "fine"


def test_a_secret_option_and_its_value_in_separate_argv_items() -> None:
    argv = ["vllm", "serve", "m", "--api-key", "sk-plain-0004", "--max-num-batched-tokens", "8192"]
    argv += ["--hf-token", "--port", "8000", "--api-key", "--", "--lora-key", "42"]
    assert redact_tree({"cmdline": argv})["cmdline"] == [
        "vllm", "serve", "m", "--api-key", "<redacted>", "--max-num-batched-tokens", "8192",
        "--hf-token", "--port", "8000", "--api-key", "--", "--lora-key", "42",
    ]  # fmt: skip


def test_flags_that_only_mention_a_secret_word_hide_nothing() -> None:
    for flag in ("--allow-credentials", "--return-tokens-as-token-ids", "--disable-log-requests"):
        argv = ["vllm", "serve", flag, "meta-llama/Llama-3.1-8B-Instruct"]
        assert redact_tree([*argv]) == argv
