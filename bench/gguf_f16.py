"""An F16 copy of a GGUF file: every quantized tensor dequantized to float16, the rest kept.

The served benchmark's ``llamacpp`` contender serves it by default, so that llama.cpp
computes in 16 bits on the same weights the other contenders load (the bundled SmolLM2 GGUF
is Q4_1, and ``conveyor models import`` dequantizes it the same way). The metadata (the
tokenizer, the chat template, the architecture's settings) is copied as it is, except the
file type, which becomes F16.

    .venv/bin/python -m bench.gguf_f16 SOURCE.gguf TARGET.gguf
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

import gguf
import numpy as np

# Tensors kept as they are: already 16 or 32 bits (llama.cpp keeps norms in F32).
_KEPT = (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16)
# Keys the writer sets itself.
_OWN_KEYS = ("general.architecture", "general.alignment", "general.file_type")


def f16_copy(source: Path, target: Path) -> Path:
    """Write ``target``: ``source`` with its quantized tensors in float16."""
    reader = gguf.GGUFReader(source)
    architecture = reader.fields["general.architecture"].contents()
    writer = gguf.GGUFWriter(str(target), architecture)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name in _OWN_KEYS:
            continue  # the header's own fields, and those above
        value_type = field.types[0]
        sub_type = field.types[-1] if value_type == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(name, field.contents(), value_type, sub_type=sub_type)
    for tensor in reader.tensors:
        if tensor.tensor_type in _KEPT:
            array = np.asarray(tensor.data)
        else:
            array = gguf.quants.dequantize(tensor.data, tensor.tensor_type).astype(np.float16)
        writer.add_tensor(tensor.name, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return target


def main(argv: Sequence[str] | None = None) -> int:
    """``SOURCE TARGET``: write the F16 copy."""
    source, target = (sys.argv[1:] if argv is None else argv)[:2]
    f16_copy(Path(source), Path(target))
    return 0


if __name__ == "__main__":
    sys.exit(main())
