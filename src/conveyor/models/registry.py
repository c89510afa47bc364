"""Build the model a config entry names."""

from __future__ import annotations

from conveyor.config import EmbeddingModelConfig, SyntheticModelConfig
from conveyor.models.base import EmbeddingModel


def build_embedding_model(config: SyntheticModelConfig | EmbeddingModelConfig) -> EmbeddingModel:
    """Load (slowly, for real models: call from a thread) the model for ``config``."""
    if isinstance(config, SyntheticModelConfig):
        from conveyor.models.synthetic import SyntheticModel

        return SyntheticModel(config)
    from conveyor.models.embedding import SentenceEmbeddingModel

    return SentenceEmbeddingModel(config)
