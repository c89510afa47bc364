"""The F16 copy of a quantized GGUF that llama.cpp serves in the served benchmark: the same
metadata but its file type, and each quantized tensor dequantized to float16."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
from bench.gguf_f16 import f16_copy

from conveyor.fakes.checkpoints import build_tiny_llama
from tests.unit.engine.gguf_files import write_gguf

Q4_1 = gguf.GGMLQuantizationType.Q4_1


def test_the_copy_keeps_the_metadata_and_dequantizes_every_quantized_tensor(
    tmp_path: Path,
) -> None:
    source = write_gguf(build_tiny_llama(tmp_path / "tiny", seed=0), tmp_path / "q.gguf",
                        matrix_type=Q4_1)  # fmt: skip
    copy = gguf.GGUFReader(f16_copy(source, tmp_path / "f16.gguf"))
    original = gguf.GGUFReader(source)
    assert set(copy.fields) == set(original.fields) | {"general.file_type"}
    for name, field in original.fields.items():
        if not name.startswith("GGUF.") and name != "general.file_type":
            assert copy.fields[name].contents() == field.contents(), name
    assert copy.fields["general.file_type"].contents() == gguf.LlamaFileType.MOSTLY_F16
    copied = {tensor.name: tensor for tensor in copy.tensors}
    assert list(copied) == [tensor.name for tensor in original.tensors]
    kinds = {tensor.tensor_type for tensor in original.tensors}
    assert Q4_1 in kinds
    for tensor in original.tensors:
        mine = copied[tensor.name]
        assert list(mine.shape) == list(tensor.shape)
        if tensor.tensor_type == gguf.GGMLQuantizationType.F32:
            assert mine.tensor_type == gguf.GGMLQuantizationType.F32
            np.testing.assert_array_equal(mine.data, tensor.data)
            continue
        assert mine.tensor_type == gguf.GGMLQuantizationType.F16
        expected = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
        np.testing.assert_allclose(np.asarray(mine.data, np.float32), expected, rtol=1e-3,
                                   atol=1e-3)  # fmt: skip
