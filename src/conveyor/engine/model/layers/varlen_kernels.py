"""The GPU's attention: FlashInfer's or flash-attn's varlen kernel over the paged KV cache.

Where one of them is installed and the model runs on CUDA, each layer attends the whole
step in one call: every sequence's queries (a prefill chunk or a single decode token)
against its context, read where the blocks lie, causal from the bottom right (a chunk's
queries are the last positions of its context). No context is copied, no mask is built,
and there is no call per sequence or per bucket. Conveyor's own path (``attention``) stays
for CPUs and for GPUs without either library.

- **FlashInfer** (``BatchPrefillWithPagedKVCacheWrapper``, layout ``NHD``, which is the
  cache's own ``[blocks, block_size, kv_heads, dim]``): any block size. Planned once a step
  (one wrapper per distinct sliding window of the model), run once a layer; decode graphs
  (``decode_graphs``) replay its CUDA-graph ``BatchDecodeWithPagedKVCacheWrapper`` instead.
- **flash-attn 2.5 or later** (``flash_attn_varlen_func`` with ``block_table``): its paged
  kernel takes blocks of a multiple of 256 tokens only, so it serves ``block_size: 256``.

Both take float16 or bfloat16 only: a float32 model keeps Conveyor's attention.
``attention_backend: auto`` (the default) takes FlashInfer, then flash-attn, where they fit,
and Conveyor's path otherwise, saying why in the log; naming one that does not fit is a
configuration error. Both libraries' contracts are stated in ``conveyor.fakes.varlen``,
whose torch versions of them run these adapters in the CPU tests.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Literal, Protocol

import torch

from conveyor.engine.model.hf_config import DecoderConfig
from conveyor.engine.model.layers.attention import Attention
from conveyor.engine.model.paged_varlen import PagedVarlen

__all__ = [
    "FLASHINFER_WORKSPACE_BYTES",
    "FLASH_ATTN_PAGE_MULTIPLE",
    "AttentionBackend",
    "FlashAttnVarlen",
    "FlashInferVarlen",
    "KernelShape",
    "VarlenKernel",
    "VarlenUnavailable",
    "install_varlen_kernel",
    "kernel_shape",
    "select_varlen_kernel",
]

AttentionBackend = Literal["auto", "conveyor", "flashinfer", "flash_attn"]

# flash-attn 2's paged KV cache: "page_block_size must be a multiple of 256".
FLASH_ATTN_PAGE_MULTIPLE = 256

# FlashInfer's scratch for split-KV partial results (its documentation's example size).
FLASHINFER_WORKSPACE_BYTES = 128 * 1024 * 1024


class VarlenUnavailable(ValueError):
    """The named attention backend cannot serve this model here (the message says why)."""


class VarlenKernel(Protocol):
    """One step's attention for every layer: planned once a step, called once a layer."""

    name: str
    num_calls: int

    def plan(self, step: PagedVarlen, host: PagedVarlen) -> None:
        """Take the step's sequences (``step`` on the device, ``host`` its host copy)."""

    def prepare_graph(self, batch_size: int, static: PagedVarlen) -> None:
        """Before a decode graph of ``batch_size`` rows is captured: its calls will read
        the step from ``static``'s tensors (see ``decode_graphs``)."""

    def plan_graph(self, batch_size: int, host: PagedVarlen) -> None:
        """Before that graph is captured or replayed: the step its static tensors hold."""

    def __call__(
        self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, window: int | None
    ) -> torch.Tensor:
        """Queries [T, heads, dim] against the caches; returns [T, heads, dim]."""


@dataclass(frozen=True, slots=True)
class KernelShape:
    """What a kernel is built for: the model's heads and the cache's blocks and dtype."""

    num_heads: int
    num_kv_heads: int
    head_dim: int
    block_size: int
    dtype: torch.dtype
    device: torch.device
    windows: frozenset[int | None]


def kernel_shape(
    config: DecoderConfig, block_size: int, dtype: torch.dtype, device: torch.device
) -> KernelShape:
    """The shape a kernel for ``config``'s model and a cache of ``block_size`` serves."""
    return KernelShape(
        num_heads=config.num_heads,
        num_kv_heads=config.num_kv_heads,
        head_dim=config.head_dim,
        block_size=block_size,
        dtype=dtype,
        device=device,
        windows=frozenset(config.sliding_windows),
    )


class FlashAttnVarlen:
    """flash-attn 2's ``flash_attn_varlen_func`` over the paged cache (``block_table``)."""

    name = "flash_attn"

    def __init__(self, module: ModuleType | Any, shape: KernelShape) -> None:
        if shape.block_size % FLASH_ATTN_PAGE_MULTIPLE:
            raise VarlenUnavailable(
                f"flash-attn's paged kernel takes blocks of a multiple of "
                f"{FLASH_ATTN_PAGE_MULTIPLE} tokens; block_size is {shape.block_size}"
            )
        self._varlen: Callable[..., torch.Tensor] = module.flash_attn_varlen_func
        if "block_table" not in inspect.signature(self._varlen).parameters:
            raise VarlenUnavailable("flash-attn before 2.5 has no paged varlen kernel")
        self._step: PagedVarlen | None = None
        self._graph_steps: dict[int, PagedVarlen] = {}
        self.num_calls = 0

    def plan(self, step: PagedVarlen, host: PagedVarlen) -> None:
        """Keep the step's device tensors for the layers' calls."""
        self._step = step

    def prepare_graph(self, batch_size: int, static: PagedVarlen) -> None:
        """Remember the graph's static tensors (the kernel reads them in place)."""
        self._graph_steps[batch_size] = static

    def plan_graph(self, batch_size: int, host: PagedVarlen) -> None:
        """The graph's calls read its static tensors, already filled by the caller."""
        self._step = self._graph_steps[batch_size]

    def __call__(
        self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, window: int | None
    ) -> torch.Tensor:
        """One call for the step's sequences (HF's window ``w``: the ``w - 1`` keys before)."""
        step = _planned(self._step)
        self.num_calls += 1
        return self._varlen(
            q,
            k_cache,
            v_cache,
            cu_seqlens_q=step.query_start,
            cu_seqlens_k=step.context_start,
            max_seqlen_q=step.max_query_len,
            max_seqlen_k=step.max_context_len,
            softmax_scale=q.shape[-1] ** -0.5,
            causal=True,
            window_size=(-1, -1) if window is None else (window - 1, 0),
            block_table=step.block_table,
        )


class FlashInferVarlen:
    """FlashInfer's paged wrappers, one per sliding window: the prefill wrapper for any
    step, and for decode graphs a CUDA-graph decode wrapper per batch size."""

    name = "flashinfer"

    def __init__(self, module: ModuleType | Any, shape: KernelShape) -> None:
        self._module = module
        self._shape = shape
        self._workspace: torch.Tensor | None = None
        self._wrappers: dict[int | None, Any] = {}
        self._graph_wrappers: dict[tuple[int, int | None], Any] = {}
        self._active: dict[int | None, Any] | None = None  # what the layers' calls run
        self.num_calls = 0

    def plan(self, step: PagedVarlen, host: PagedVarlen) -> None:
        """Plan every window's prefill wrapper (offsets from the host copy: no device
        sync); the first plan makes the wrappers."""
        shape = self._shape
        if not self._wrappers:
            self._wrappers = {
                window: self._module.BatchPrefillWithPagedKVCacheWrapper(self._buffer(), "NHD")
                for window in shape.windows
            }
        for window, wrapper in self._wrappers.items():
            wrapper.plan(
                host.query_start,
                host.page_start,
                step.page_ids,
                host.last_page_len,
                shape.num_heads,
                shape.num_kv_heads,
                shape.head_dim,
                shape.block_size,
                causal=True,
                window_left=_window_left(window),
                q_data_type=shape.dtype,
                kv_data_type=shape.dtype,
            )
        self._active = self._wrappers

    def prepare_graph(self, batch_size: int, static: PagedVarlen) -> None:
        """A CUDA-graph decode wrapper per window over the graph's static page tensors."""
        for window in self._shape.windows:
            self._graph_wrappers[batch_size, window] = (
                self._module.BatchDecodeWithPagedKVCacheWrapper(
                    self._buffer(),
                    "NHD",
                    use_cuda_graph=True,
                    paged_kv_indptr_buffer=static.page_start[: batch_size + 1],
                    paged_kv_indices_buffer=static.page_ids,
                    paged_kv_last_page_len_buffer=static.last_page_len[:batch_size],
                )
            )

    def plan_graph(self, batch_size: int, host: PagedVarlen) -> None:
        """Plan the graph's decode wrappers: they copy the pages into its static tensors."""
        shape = self._shape
        active = {}
        for window in shape.windows:
            wrapper = self._graph_wrappers[batch_size, window]
            wrapper.plan(
                host.page_start,
                host.page_ids,
                host.last_page_len,
                shape.num_heads,
                shape.num_kv_heads,
                shape.head_dim,
                shape.block_size,
                window_left=_window_left(window),
                q_data_type=shape.dtype,
                kv_data_type=shape.dtype,
            )
            active[window] = wrapper
        self._active = active

    def __call__(
        self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, window: int | None
    ) -> torch.Tensor:
        """Run the window's planned wrapper over this layer's caches."""
        if self._active is None:
            raise RuntimeError("the varlen kernel runs only after plan()")
        self.num_calls += 1
        out: torch.Tensor = self._active[window].run(q.contiguous(), (k_cache, v_cache))
        return out

    def _buffer(self) -> torch.Tensor:
        """The wrappers' shared scratch, made at the first use."""
        if self._workspace is None:
            self._workspace = torch.zeros(
                FLASHINFER_WORKSPACE_BYTES, dtype=torch.uint8, device=self._shape.device
            )
        return self._workspace


def _window_left(window: int | None) -> int:
    """FlashInfer's ``window_left`` for Hugging Face's window: the keys before the query."""
    return -1 if window is None else window - 1


def _planned(step: PagedVarlen | None) -> PagedVarlen:
    """The planned step, or a clear error for a call before any plan."""
    if step is None:
        raise RuntimeError("the varlen kernel runs only after plan()")
    return step


_ADAPTERS: dict[str, tuple[str, type[FlashAttnVarlen] | type[FlashInferVarlen]]] = {
    "flashinfer": ("flashinfer", FlashInferVarlen),
    "flash_attn": ("flash_attn", FlashAttnVarlen),
}


def select_varlen_kernel(
    choice: AttentionBackend,
    shape: KernelShape,
    importer: Callable[[str], ModuleType | Any] = importlib.import_module,
) -> tuple[VarlenKernel | None, str]:
    """The kernel ``choice`` gives for ``shape``, and why (for the log).

    ``conveyor``: none. ``auto``: FlashInfer, then flash-attn, the first installed that fits
    (none on a CPU, or where neither fits: Conveyor's own attention). A named backend that
    cannot serve raises :class:`VarlenUnavailable`.
    """
    if choice == "conveyor":
        return None, "attention_backend is conveyor"
    names = ["flashinfer", "flash_attn"] if choice == "auto" else [choice]
    reasons = []
    for name in names:
        try:
            return _build(name, shape, importer), f"{name}'s varlen paged kernel"
        except VarlenUnavailable as unavailable:
            if choice != "auto":
                raise
            reasons.append(str(unavailable))
    return None, "Conveyor's attention: " + "; ".join(reasons)


def _build(
    name: str, shape: KernelShape, importer: Callable[[str], ModuleType | Any]
) -> VarlenKernel:
    """One adapter, or :class:`VarlenUnavailable` saying why not."""
    if shape.device.type != "cuda":
        raise VarlenUnavailable(f"{name} runs on CUDA only; the model is on {shape.device}")
    if shape.dtype not in (torch.float16, torch.bfloat16):
        raise VarlenUnavailable(f"{name} takes float16 or bfloat16; the model is {shape.dtype}")
    module_name, adapter = _ADAPTERS[name]
    try:
        module = importer(module_name)
    except ImportError as error:
        raise VarlenUnavailable(f"{name} is not installed ({error})") from error
    except (OSError, RuntimeError) as error:  # installed, but built for another CUDA or torch
        raise VarlenUnavailable(f"{name} is installed but does not load ({error})") from error
    return adapter(module, shape)


def install_varlen_kernel(
    attentions: Sequence[Attention], windows: Sequence[int | None], kernel: VarlenKernel
) -> None:
    """Every layer attends through ``kernel``, each with its own sliding window."""
    if len(attentions) != len(windows):
        raise ValueError(f"{len(attentions)} attention layers but {len(windows)} windows")
    for attention, window in zip(attentions, windows, strict=True):
        attention.varlen = kernel
        attention.window = window
