"""Huge pages for the CPU KV cache: the advice reaches the kernel (``hg`` in the mapping's
``VmFlags``) and covers the cache's whole 2 MiB pages; small or non-CPU tensors get none."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from conveyor.engine.model.huge_pages import HUGE_PAGE_BYTES, advise_huge_pages
from conveyor.engine.model.layers.paged_attention import cache_at_offset

pytestmark = pytest.mark.model  # runs torch code: left out of mutation runs

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="madvise is Linux's")


def _vm_flags(address: int) -> list[str]:
    """The ``VmFlags`` of the mapping of this process that holds ``address``."""
    inside = False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()[0]
        if "-" in head and ":" not in head:  # a mapping's first line: "start-end perms ..."
            start, end = (int(part, 16) for part in head.split("-"))
            inside = start <= address < end
        elif inside and head == "VmFlags:":
            return line.split()[1:]
    raise AssertionError(f"no mapping holds {address:#x}")


@linux_only
def test_a_cache_from_cache_at_offset_is_advised_into_huge_pages() -> None:
    shape = (2, 2, 640, 16, 3, 64)  # 15 MiB of bfloat16: whole huge pages inside it
    cache = cache_at_offset(shape, torch.bfloat16, torch.device("cpu"))
    assert cache.shape == shape and not cache.any()
    middle = cache.data_ptr() + cache.numel() * cache.element_size() // 2
    assert "hg" in _vm_flags(middle)


@linux_only
def test_the_advice_covers_the_whole_huge_pages_inside_the_tensor() -> None:
    flat = torch.empty(8 * HUGE_PAGE_BYTES, dtype=torch.uint8)
    first, last = flat.data_ptr(), flat.data_ptr() + flat.numel()
    whole = (last // HUGE_PAGE_BYTES - -(-first // HUGE_PAGE_BYTES)) * HUGE_PAGE_BYTES
    assert advise_huge_pages(flat) == whole >= 7 * HUGE_PAGE_BYTES


def test_a_tensor_smaller_than_a_huge_page_is_left_alone() -> None:
    small = torch.zeros(1024, dtype=torch.float32)
    assert advise_huge_pages(small) == 0


def test_a_tensor_off_the_cpu_is_left_alone() -> None:
    assert (
        advise_huge_pages(torch.empty(8 * HUGE_PAGE_BYTES, dtype=torch.uint8, device="meta")) == 0
    )
