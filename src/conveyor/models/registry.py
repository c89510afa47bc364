"""Build the model a config entry names."""

from __future__ import annotations

from typing import TYPE_CHECKING

from conveyor.config.model_config import (
    EmbeddingModelConfig,
    GenerateModelConfig,
    RerankModelConfig,
    SyntheticModelConfig,
)
from conveyor.models.base import EmbeddingModel
from conveyor.observability.metrics import GeneratorMetrics

if TYPE_CHECKING:
    from conveyor.engine.generator import HostedGenerator


def build_embedding_model(
    config: SyntheticModelConfig | EmbeddingModelConfig | RerankModelConfig,
) -> EmbeddingModel:
    """Load (slowly, for real models: call from a thread) the model for ``config``."""
    if isinstance(config, SyntheticModelConfig):
        from conveyor.models.synthetic import SyntheticModel

        return SyntheticModel(config)
    if isinstance(config, RerankModelConfig):
        from conveyor.models.cross_encoder import CrossEncoderModel

        return CrossEncoderModel(config)
    from conveyor.models.embedding import SentenceEmbeddingModel

    return SentenceEmbeddingModel(config)


def build_generator(config: GenerateModelConfig, metrics: GeneratorMetrics) -> HostedGenerator:
    """Load a generative model and start its engine (slow: call from a thread)."""
    if config.engine == "vllm":
        from conveyor.engine.vllm_factory import load_vllm_generator

        return load_vllm_generator(config, metrics)
    from conveyor.engine.generator_factory import load_generator

    return load_generator(config, metrics)
