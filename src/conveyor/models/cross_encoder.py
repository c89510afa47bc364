"""Cross-encoders (rerankers) behind the one-shot protocol: a (query, document) pair in,
one relevance score out, batched like embedding inputs.

Scores equal sentence-transformers' ``CrossEncoder.predict`` on the same directory: the
single logit through a sigmoid, or as is when the checkpoint names an identity activation.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from conveyor.config.model_config import RerankModelConfig
from conveyor.errors import ConfigError, InvalidRequest, ModelOutOfMemory
from conveyor.models.base import EmbeddingInput, EncodedInput, Vector
from conveyor.models.embedding import resolve_device

Pair = tuple[str, str]


def uses_identity_activation(hf_config: Any) -> bool:
    """Whether the checkpoint asks for raw logits (sentence-transformers' saved setting)."""
    saved = getattr(hf_config, "sentence_transformers", None) or {}
    path = saved.get("activation_fn") or getattr(
        hf_config, "sbert_ce_default_activation_function", None
    )
    return isinstance(path, str) and path.endswith("Identity")


class CrossEncoderModel:
    """Tokenises pairs on the event loop; pads and runs them on the model thread."""

    dim = 1

    def __init__(self, config: RerankModelConfig) -> None:
        import torch
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        if config.threads is not None:
            torch.set_num_threads(config.threads)
        self.name = config.name
        self.device = resolve_device(config.device)
        self._torch = torch
        path = str(config.path)
        self.tokenizer: Any = AutoTokenizer.from_pretrained(path, local_files_only=True)
        model: Any = AutoModelForSequenceClassification.from_pretrained(path, local_files_only=True)
        self._model = model.to(self.device).eval()
        if int(model.config.num_labels) != 1:
            raise ConfigError(f"rerank model {config.name!r} must have one label (num_labels=1)")
        self._is_identity = uses_identity_activation(model.config)
        model_limit = int(getattr(model.config, "max_position_embeddings", 512))
        self.max_input_tokens = min(config.max_input_tokens or model_limit, model_limit)
        self._pad_id = int(self.tokenizer.pad_token_id or 0)

    def encode(self, inputs: Sequence[EmbeddingInput], *, truncate: bool) -> list[EncodedInput]:
        """A reranker does not embed: a 400 that points to the right endpoint."""
        raise InvalidRequest(
            f"the model {self.name!r} is a rerank model; use /v1/rerank or /v1/score",
            param="model",
        )

    def encode_pairs(self, pairs: Sequence[Pair], *, truncate: bool) -> list[EncodedInput]:
        """Token ids (and segment ids) of each pair; too long is a 400 unless truncating."""
        limit = self.max_input_tokens
        encoded = self.tokenizer(
            [query for query, _ in pairs], [document for _, document in pairs],
            truncation="longest_first" if truncate else False,
            max_length=limit if truncate else None,
        )  # fmt: skip
        types = encoded.get("token_type_ids")
        result = []
        for index, ids in enumerate(encoded["input_ids"]):
            if len(ids) > limit:
                raise InvalidRequest(
                    f"pair {index} has {len(ids)} tokens, more than this model accepts "
                    f'({limit}); shorten it or send "truncate": true',
                    param="documents",
                )
            payload = (list(ids), list(types[index]) if types is not None else None)
            result.append(EncodedInput(payload, len(ids)))
        return result

    def embed_batch(self, payloads: list[Any]) -> list[Vector]:
        """One score per pair, each as a one-element vector."""
        torch = self._torch
        longest = max(len(ids) for ids, _ in payloads)
        input_ids = torch.full((len(payloads), longest), self._pad_id, dtype=torch.long)
        mask = torch.zeros((len(payloads), longest), dtype=torch.long)
        segments = torch.zeros((len(payloads), longest), dtype=torch.long)
        for row, (ids, types) in enumerate(payloads):
            input_ids[row, : len(ids)] = torch.tensor(ids, dtype=torch.long)
            mask[row, : len(ids)] = 1
            if types is not None:
                segments[row, : len(types)] = torch.tensor(types, dtype=torch.long)
        features = {"input_ids": input_ids, "attention_mask": mask}
        if any(types is not None for _, types in payloads):
            features["token_type_ids"] = segments
        features = {key: value.to(self.device) for key, value in features.items()}
        try:
            with torch.inference_mode():
                logits = self._model(**features).logits[:, 0].float()
        except torch.OutOfMemoryError as exc:
            raise ModelOutOfMemory(str(exc)) from exc
        scores = logits if self._is_identity else torch.sigmoid(logits)
        array = scores.cpu().numpy().astype(np.float32).reshape(-1, 1)
        return list(array)

    def close(self) -> None:
        """Drop the weights (and the CUDA cache when on a GPU)."""
        del self._model
        if self.device.startswith("cuda"):
            self._torch.cuda.empty_cache()
