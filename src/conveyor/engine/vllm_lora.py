"""A null LoRA adapter for base requests on vLLM's CPU build, where base rows need one.

vLLM's CPU LoRA kernels (0.32: ``vllm.lora.ops.torch_ops``, always the SGMV path) index the
stacked adapter weights with each token's slot, and a token without an adapter has slot -1:
in a step that mixes base and adapter tokens, the base tokens get the adapter in the *last*
slot (a step of base tokens only skips LoRA and is right; vLLM's GPU kernels skip -1). So
on CPU, Conveyor sends the base requests of a model with ``lora`` under a null adapter: rank
1, zero weights, one slot of its own (``max_loras`` + 1). No token has slot -1 then, and a
zero delta leaves the base's numbers exactly as they are.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from conveyor.engine.model.hf_config import DecoderConfig
from conveyor.engine.model.lora.files import CONFIG_FILE, WEIGHTS_FILE

__all__ = ["NULL_ADAPTER_ID", "NULL_ADAPTER_NAME", "null_adapter_args", "write_null_adapter"]

# vLLM's name and id of the null adapter: "@" is in no Conveyor name, and the registry's ids
# count up from 1.
NULL_ADAPTER_NAME = "@base"
NULL_ADAPTER_ID = 2**31 - 1


def null_adapter_args(args: dict[str, Any]) -> dict[str, Any]:
    """Engine arguments with one more adapter slot, the null adapter's."""
    return {**args, "max_loras": int(args.get("max_loras", 1)) + 1}


def write_null_adapter(directory: Path, config: DecoderConfig) -> dict[str, Any]:
    """Write the null adapter (zero ``q_proj`` LoRA of rank 1 on the first layer) into
    ``directory``; vLLM's ``LoRARequest`` keywords for it."""
    from safetensors.torch import save_file
    from torch import zeros

    directory.mkdir(parents=True, exist_ok=True)
    peft = {"peft_type": "LORA", "r": 1, "lora_alpha": 1, "target_modules": ["q_proj"],
            "bias": "none", "lora_dropout": 0.0, "task_type": "CAUSAL_LM"}  # fmt: skip
    (directory / CONFIG_FILE).write_text(json.dumps(peft))
    prefix = "base_model.model.model.layers.0.self_attn.q_proj"
    tensors = {
        f"{prefix}.lora_A.weight": zeros(1, config.hidden_size),
        f"{prefix}.lora_B.weight": zeros(config.q_size, 1),
    }
    save_file(tensors, str(directory / WEIGHTS_FILE))
    return {"lora_name": NULL_ADAPTER_NAME, "lora_int_id": NULL_ADAPTER_ID,
            "lora_path": str(directory)}  # fmt: skip
