"""Loading a generative model from its config: limits checked against the checkpoint."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from conveyor.config.model_config import GenerateModelConfig
from conveyor.engine.generator import HostedGenerator
from conveyor.engine.generator_factory import DEFAULT_CPU_KV_CACHE_TOKENS, load_generator
from conveyor.engine.model import model_runner
from conveyor.engine.model.hf_config import DecoderConfig, load_hf_config
from conveyor.engine.model.model_runner import ModelRunner
from conveyor.errors import ConfigError
from conveyor.observability.metrics import Metrics

pytestmark = pytest.mark.model  # runs torch code: left out of mutation runs


def model_config(path: Path, **kw: object) -> GenerateModelConfig:
    return GenerateModelConfig(kind="generate", name="tiny", path=path, device="cpu", **kw)


@contextlib.contextmanager
def loaded(path: Path, **kw: object) -> Iterator[HostedGenerator]:
    """A generator loaded from ``model_config(path, **kw)``, stopped on exit."""
    generator = load_generator(model_config(path, **kw), Metrics().for_generator("tiny"))
    try:
        yield generator
    finally:
        generator.stop()


def checkpoint_limit(path: Path) -> int:
    return DecoderConfig.from_hf(load_hf_config(path)).max_position_embeddings


def test_a_max_model_len_beyond_the_checkpoint_is_refused_at_load(llama_path: Path) -> None:
    limit = checkpoint_limit(llama_path)
    config = model_config(llama_path, max_model_len=limit + 1)
    expected = f"'tiny': max_model_len {limit + 1} exceeds the checkpoint's {limit}"
    with pytest.raises(ConfigError, match=expected):
        load_generator(config, Metrics().for_generator("tiny"))


def test_a_cpu_model_without_a_kv_cache_size_gets_the_default_size(llama_path: Path) -> None:
    assert checkpoint_limit(llama_path) < DEFAULT_CPU_KV_CACHE_TOKENS
    with loaded(llama_path, block_size=16) as generator:
        assert generator.engine.config.num_kv_blocks == DEFAULT_CPU_KV_CACHE_TOKENS // 16
        assert generator.max_model_len == checkpoint_limit(llama_path)


@pytest.mark.parametrize(("configured", "expected"), [({}, 32), ({"job_tokens_beside_online": 8}, 8),
                                                      ({"job_tokens_beside_online": None}, None)])  # fmt: skip
def test_the_job_token_cap_beside_online_traffic_reaches_the_engine(
    llama_path: Path, configured: dict[str, object], expected: int | None
) -> None:
    with loaded(llama_path, **configured) as generator:
        assert generator.engine.config.job_tokens_beside_online == expected


def test_pinned_cores_reach_the_engine_with_one_thread_each(llama_path: Path) -> None:
    core = min(os.sched_getaffinity(0))
    threads_before = torch.get_num_threads()
    generator = load_generator(
        model_config(llama_path, cpu_cores=[core]), Metrics().for_generator("tiny")
    )
    try:
        assert generator.engine.config.cpu_cores == (core,)
        assert generator.engine.config.threads == 1
    finally:
        generator.stop()
        torch.set_num_threads(threads_before)


def test_kv_offload_sizes_the_tier_in_blocks_from_its_byte_budgets(
    llama_path: Path, tmp_path: Path
) -> None:
    config = model_config(llama_path, block_size=16, kv_cache_tokens=256, max_model_len=128)
    generator = load_generator(config, Metrics().for_generator("tiny"))
    block_bytes = generator.engine._runner.kv_cache[:, :, 0].nbytes  # type: ignore[attr-defined]
    generator.stop()
    offload = {
        "host_bytes": 10 * block_bytes + 1,
        "disk_path": tmp_path,
        "disk_bytes": 3 * block_bytes,
    }
    generator = load_generator(
        model_config(
            llama_path, block_size=16, kv_cache_tokens=256, max_model_len=128, kv_offload=offload
        ),
        Metrics().for_generator("tiny"),
    )
    try:
        tier = generator.engine.kv_offload
        assert tier is not None
        assert (tier.index.host_blocks, tier.index.disk_blocks) == (10, 3)
    finally:
        generator.stop()


def test_a_host_tier_smaller_than_a_block_is_refused(llama_path: Path) -> None:
    config = model_config(
        llama_path, kv_cache_tokens=256, max_model_len=128, kv_offload={"host_bytes": 1}
    )
    with pytest.raises(ConfigError, match="less than one KV block"):
        load_generator(config, Metrics().for_generator("tiny"))


def test_kv_offload_on_the_vllm_engine_is_refused_not_yet(llama_path: Path) -> None:
    with pytest.raises(ValueError, match="kv_offload is not yet available on engine: vllm"):
        model_config(llama_path, engine="vllm", kv_offload={"host_bytes": 1 << 20})


@pytest.mark.parametrize("native", [True, False])
@pytest.mark.parametrize("enforce_eager", [True, False])
def test_enforce_eager_reaches_the_runner(
    llama_path: Path, enforce_eager: bool, native: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The runner's own compile (seconds to minutes) is tested with the runner
    # (tests/unit/engine/model/test_model_runner.py); here only the wiring: stand-ins that
    # record being asked to compile.
    asked: list[str] = []
    compiled = object()

    def compile_decode(model: object, kv_cache: object) -> tuple[object, float]:
        asked.append("decode")
        return compiled, 0.0

    def compile_layers(runner: object) -> float:
        asked.append("layers")
        return 0.0

    monkeypatch.setattr(model_runner, "compile_decode_attention", compile_decode)
    monkeypatch.setattr(model_runner, "compile_layers", compile_layers)
    config = model_config(llama_path, enforce_eager=enforce_eager, native_kernels=native)
    assert model_config(llama_path).enforce_eager is True  # eager unless asked
    assert model_config(llama_path).native_kernels is True  # native unless refused
    generator = load_generator(config, Metrics().for_generator("tiny"))
    try:
        runner = generator.engine._runner
        assert isinstance(runner, ModelRunner)
        assert (runner.native_decode is not None) is native
        # The native kernel stands in for the compiled decode attention.
        expected = [] if enforce_eager else ["layers"] if native else ["decode", "layers"]
        assert asked == expected
        assert runner.compiled_decode is (compiled if expected[:1] == ["decode"] else None)
    finally:
        generator.stop()


def test_the_arrival_window_reaches_the_engine_in_seconds(llama_path: Path) -> None:
    with loaded(llama_path, arrival_window_ms=20, arrival_quiet_ms=4) as generator:
        assert generator.engine.config.arrival_window_s == pytest.approx(0.02)
        assert generator.engine.config.arrival_quiet_s == pytest.approx(0.004)


@pytest.mark.parametrize(("tokens", "expected"), [(None, 96), (40, 40), (0, 0)])
def test_the_engine_warms_up_with_a_full_step_or_warm_up_tokens(
    llama_path: Path, tokens: int | None, expected: int
) -> None:
    # None: max_num_batched_tokens, the shape of every full step; 0: no warm-up.
    with loaded(
        llama_path, max_num_batched_tokens=96, warm_up_tokens=tokens, kv_cache_tokens=1024
    ) as generator:
        chunks = generator.engine.config.warm_up_chunks
        assert sum(len(chunk.token_ids) for chunk in chunks) == expected
        # and the row buckets of steps up to a full step, unless the warm-up is off
        assert generator.engine.config.warm_up_rows == (0 if tokens == 0 else 96)


def test_a_row_bucket_limit_reaches_the_runner(llama_path: Path) -> None:
    assert model_config(llama_path).row_buckets_up_to is None  # measured unless set
    with loaded(llama_path, row_buckets_up_to=100, warm_up_tokens=0) as generator:
        runner = generator.engine._runner
        assert isinstance(runner, ModelRunner)
        assert runner.pad_up_to == 100


def test_a_named_attention_backend_that_cannot_serve_is_a_config_error(llama_path: Path) -> None:
    config = model_config(llama_path, attention_backend="flashinfer")
    with pytest.raises(ConfigError, match=r"'tiny': attention_backend flashinfer: .*CUDA only"):
        load_generator(config, Metrics().for_generator("tiny"))


def test_auto_attention_on_a_cpu_is_conveyors_and_says_why(
    llama_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    assert model_config(llama_path).attention_backend == "auto"
    with caplog.at_level("INFO"), loaded(llama_path) as generator:
        runner = generator.engine._runner
        assert isinstance(runner, ModelRunner) and runner.varlen_kernel is None
        assert runner.decode_graphs is None  # graphs need CUDA and a varlen kernel
    assert "model tiny attends with Conveyor's attention: flashinfer runs on CUDA only" in (
        caplog.text
    )
