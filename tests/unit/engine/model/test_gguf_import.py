"""`conveyor models import`: a tiny GGUF file written as a checkpoint directory that loads
with Conveyor's safetensors path and with transformers, giving the same weights."""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import pytest
import torch
from safetensors import safe_open
from typer.testing import CliRunner

from conveyor.cli.main import app as cli_app
from conveyor.engine.model.gguf_import import import_gguf, plan_shards
from conveyor.engine.model.hf_config import DecoderConfig, load_hf_config
from conveyor.engine.model.llama import LlamaDecoder
from conveyor.engine.model.weight_loader import load_weights
from conveyor.engine.tokenizer import Tokenizer
from conveyor.fakes.checkpoints import build_tiny_llama
from tests.unit.engine.gguf_files import write_gguf

pytestmark = pytest.mark.model  # runs torch code: left out of mutation runs


@pytest.fixture(scope="module")
def gguf_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("import")
    checkpoint = build_tiny_llama(root / "hf", tie_word_embeddings=True)
    return write_gguf(checkpoint, root / "tiny.gguf", matrix_type=gguf.GGMLQuantizationType.Q4_1)


def _state(path: Path) -> dict[str, torch.Tensor]:
    config = DecoderConfig.from_hf(load_hf_config(path))
    model = LlamaDecoder(config, device=torch.device("cpu"), dtype=torch.float32)
    load_weights(model, config, path)
    return model.state_dict()


def test_the_imported_directory_loads_the_same_model_in_conveyor_and_transformers(
    gguf_file: Path, tmp_path: Path
) -> None:
    from transformers import AutoModelForCausalLM

    out = import_gguf(gguf_file, tmp_path / "out").directory
    assert DecoderConfig.from_hf(load_hf_config(out)) == DecoderConfig.from_hf(
        load_hf_config(gguf_file)
    )
    ours, imported = _state(gguf_file), _state(out)
    assert all(torch.equal(imported[name], tensor) for name, tensor in ours.items())
    hf = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32).eval()
    reference = AutoModelForCausalLM.from_pretrained(
        str(gguf_file.parent), gguf_file=gguf_file.name, dtype=torch.float32
    ).eval()
    ids = torch.tensor([[1, 40, 41, 42, 43]])
    with torch.no_grad():
        assert torch.equal(hf(ids).logits, reference(ids).logits)
    chat = [{"role": "user", "content": "hello there! café 🙂"}]
    assert Tokenizer(out).apply_chat_template(chat) == Tokenizer(gguf_file).apply_chat_template(
        chat
    )
    generation = json.loads((out / "generation_config.json").read_text())
    assert (generation["bos_token_id"], generation["eos_token_id"]) == (1, 2)


def test_shards_hold_the_weights_in_order_with_an_index(gguf_file: Path, tmp_path: Path) -> None:
    result = import_gguf(gguf_file, tmp_path / "out", max_shard_bytes=64 * 1024)
    assert len(result.weight_files) > 1
    index = json.loads((result.directory / "model.safetensors.index.json").read_text())
    assert sorted(set(index["weight_map"].values())) == list(result.weight_files)
    assert index["metadata"]["total_size"] == result.weight_bytes
    imported, whole = _state(result.directory), _state(gguf_file)
    assert all(torch.equal(imported[name], tensor) for name, tensor in whole.items())


def test_a_half_precision_import_stores_and_says_its_dtype(gguf_file: Path, tmp_path: Path) -> None:
    out = import_gguf(gguf_file, tmp_path / "out", dtype="bfloat16").directory
    with safe_open(str(out / "model.safetensors"), framework="pt") as handle:
        assert {handle.get_tensor(name).dtype for name in handle.keys()} == {torch.bfloat16}  # noqa: SIM118
    assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"


def test_an_import_refuses_a_used_directory_and_leaves_nothing_when_it_fails(
    gguf_file: Path, tmp_path: Path
) -> None:
    used = tmp_path / "used"
    used.mkdir()
    (used / "keep.txt").write_text("mine")
    with pytest.raises(ValueError, match="already exists and is not an empty directory"):
        import_gguf(gguf_file, used)
    broken = write_gguf(build_tiny_llama(tmp_path / "hf"), tmp_path / "b.gguf", architecture="gpt2")
    with pytest.raises(ValueError, match="unsupported GGUF architecture 'gpt2'"):
        import_gguf(broken, tmp_path / "never")
    assert sorted(path.name for path in tmp_path.iterdir()) == ["b.gguf", "hf", "used"]


def test_the_command_prints_what_it_wrote_or_one_line_why_not(
    gguf_file: Path, tmp_path: Path
) -> None:
    done = CliRunner().invoke(cli_app, ["models", "import", str(gguf_file), str(tmp_path / "o")])
    assert done.exit_code == 0, done.output
    assert (
        done.output.startswith(f"{tmp_path / 'o'}: ") and "in 1 safetensors file (" in done.output
    )
    failed = CliRunner().invoke(
        cli_app, ["models", "import", str(gguf_file), str(tmp_path / "p"), "--dtype", "int8"]
    )
    assert failed.exit_code == 1
    assert failed.output.strip() == (
        "import failed: dtype must be one of float32, float16, bfloat16, got 'int8'"
    )


@pytest.mark.parametrize(
    ("sizes", "limit", "expected"),
    [
        ([("a", 4), ("b", 4), ("c", 4)], 8, [["a", "b"], ["c"]]),
        ([("a", 10), ("b", 1)], 4, [["a"], ["b"]]),  # a tensor above the limit stands alone
        ([("a", 1), ("b", 1)], 100, [["a", "b"]]),
        ([], 8, []),
    ],
)
def test_shards_are_planned_in_order_under_the_limit(
    sizes: list[tuple[str, int]], limit: int, expected: list[list[str]]
) -> None:
    assert plan_shards(sizes, limit) == expected
