"""Write a randomly initialised Llama checkpoint of a real model's shape, built on the device.

The tiny builders in ``conveyor.fakes.checkpoints`` initialise float32 weights on the CPU, which
for 8B parameters takes minutes and 32 GB. This one initialises them on the target
device directly in the target dtype and saves them as safetensors (16 GB for Llama-3-8B
in bfloat16), next to the tiny test tokenizer (the model's vocabulary stays the real
model's size; sampled ids past the tokenizer's vocabulary detokenize to nothing).

    python -m bench.big_checkpoint --model llama3-8b --device cuda --dtype bfloat16 --out DIR
    python -m bench.big_checkpoint --model tiny-8b-shape --out DIR   # CPU smoke of the path
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from conveyor.fakes.checkpoints import build_tiny_tokenizer

# Llama-3-8B's shape; "tiny-8b-shape" keeps its proportions (GQA 4:1, vocab far larger
# than the tokenizer's) at a size a CPU builds in a second, to check the path.
SHAPES: dict[str, dict[str, Any]] = {
    "llama3-8b": {
        "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
        "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256,
        "max_position_embeddings": 8192, "rope_theta": 500000.0,
    },
    "tiny-8b-shape": {
        "hidden_size": 128, "intermediate_size": 448, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 1, "vocab_size": 4096,
        "max_position_embeddings": 1024, "rope_theta": 500000.0,
    },
}  # fmt: skip
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def build_checkpoint(
    directory: Path, shape: str, *, device: str, dtype: torch.dtype, seed: int = 0
) -> Path:
    """Initialise the model on ``device`` in ``dtype`` and save it with the tokenizer."""
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    directory.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tiny_tokenizer(directory)
    config = LlamaConfig(
        **SHAPES[shape],
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
        rms_norm_eps=1e-5,
    )
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)  # initialise in the target dtype: no float32 copy
    try:
        with torch.random.fork_rng(devices=[]), torch.device(device):
            torch.manual_seed(seed)
            model = LlamaForCausalLM(config).eval()
    finally:
        torch.set_default_dtype(previous)
    model.generation_config = GenerationConfig(  # type: ignore[no-untyped-call]
        bos_token_id=config.bos_token_id,
        eos_token_id=config.eos_token_id,
        pad_token_id=config.pad_token_id,
        do_sample=False,
    )
    model.save_pretrained(str(directory), max_shard_size="5GB")
    return directory


def weight_bytes(directory: Path) -> int:
    """Bytes of the checkpoint's safetensors files (the weights a decode step streams)."""
    return sum(file.stat().st_size for file in directory.glob("*.safetensors"))


def main(argv: Sequence[str] | None = None) -> int:
    """Build the checkpoint; print its size as JSON."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="llama3-8b", choices=sorted(SHAPES))
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="bfloat16", choices=sorted(DTYPES))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    started = time.perf_counter()
    path = build_checkpoint(
        args.out, args.model, device=args.device, dtype=DTYPES[args.dtype], seed=args.seed
    )
    info = {
        "path": str(path),
        "model": args.model,
        "dtype": args.dtype,
        "weight_bytes": weight_bytes(path),
        "build_s": round(time.perf_counter() - started, 1),
    }
    print(json.dumps(info), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
