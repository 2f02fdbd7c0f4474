"""Make a tiny random Llama and a byte-level BPE tokenizer in a folder: no hub download.

Runs in the real-engine venv (transformers, tokenizers, torch). vLLM's CPU attention rejects
head_dim 16, so heads are 64 wide; the weights are random, the shapes real.
Usage: python make_model.py DIR
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

TEXT = [
    "The quick brown fox jumps over the lazy dog. " * 4,
    "Reply with one word: ok. Hello world, this is a tiny model for tests. " * 4,
    "0123456789 abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ .,;:!?()[]{}'\"-_/" * 2,
]


def tokenizer(out: Path) -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=512,
        special_tokens=["<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(TEXT, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>")
    fast.save_pretrained(out)
    return fast


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    tok = tokenizer(out)
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=512,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        torch_dtype="bfloat16",
    )
    LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained(out, safe_serialization=True)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
