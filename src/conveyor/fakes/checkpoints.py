"""Builders for tiny, randomly initialised checkpoints used by tests and benchmarks.

Each builder writes a complete Hugging Face checkpoint directory (``config.json``,
``generation_config.json``, ``*.safetensors`` and a tokenizer) without touching the
network, so ``AutoTokenizer.from_pretrained`` and ``model.generate`` work on it and the
engine can load it like a real model.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

import torch

__all__ = [
    "LORA_TARGET_MODULES",
    "TINY_CHAT_TEMPLATE",
    "ModelSize",
    "build_lora_adapter",
    "build_tiny_llama",
    "build_tiny_mistral",
    "build_tiny_qwen2",
    "build_tiny_qwen3",
    "build_tiny_tokenizer",
    "device_under_test",
    "dtype_under_test",
    "torch_threads",
]

ModelSize = Literal["tiny", "bench"]

# Where the engine's model tests run: "cpu" unless set (the GPU device check sets "cuda").
TEST_DEVICE_ENV = "CONVEYOR_TEST_DEVICE"
# Their dtype: "float32" unless set; greedy parity with HF holds token for token in float32.
TEST_DTYPE_ENV = "CONVEYOR_TEST_DTYPE"
TEST_EAGER_ENV = "CONVEYOR_TEST_ENFORCE_EAGER"


def device_under_test() -> str:
    """The device the engine's model tests use (``CONVEYOR_TEST_DEVICE``, default "cpu")."""
    return os.environ.get(TEST_DEVICE_ENV, "cpu")


def dtype_under_test() -> torch.dtype:
    """The dtype of those tests (``CONVEYOR_TEST_DTYPE``: float32, bfloat16 or float16)."""
    name = os.environ.get(TEST_DTYPE_ENV, "float32")
    dtypes = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
    if name not in dtypes:
        raise ValueError(f"{TEST_DTYPE_ENV} must be one of {sorted(dtypes)}, got {name!r}")
    return dtypes[name]


def enforce_eager_under_test() -> bool:
    """Whether those tests run eager (``CONVEYOR_TEST_ENFORCE_EAGER``, default "1"; "0"
    compiles the CPU decode attention, paying its compile once per test process)."""
    value = os.environ.get(TEST_EAGER_ENV, "1")
    if value not in ("0", "1"):
        raise ValueError(f"{TEST_EAGER_ENV} must be 0 or 1, got {value!r}")
    return value == "1"


BOS_TOKEN = "<s>"
EOS_TOKEN = "</s>"
PAD_TOKEN = "<pad>"

# Roles are plain text so the template needs no extra special tokens; the end of a turn is
# the EOS token, which is what makes a chat reply stop.
TINY_CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ message['role'] }}: {{ message['content'] }}{{ eos_token }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)

# Training text for the tokenizer: English prose plus accented, CJK and emoji text so that
# some characters span several byte-level tokens (the streaming detokenizer must cope).
_TOKENIZER_CORPUS = (
    "The quick brown fox jumps over the lazy dog. A batching server groups requests "
    "so that the accelerator stays busy; each request streams its tokens back as soon "
    "as they are sampled. Continuous batching admits new sequences between decode steps.",
    "Paged attention stores keys and values in fixed-size blocks. A block table maps a "
    "sequence's logical positions to physical blocks, so memory is never fragmented.",
    "user: hello there! assistant: hi, how can I help you today? user: tell me a story.",
    "Numbers 0 1 2 3 4 5 6 7 8 9 10 11 12 100 1000 2024 3.14159 and symbols + - * / = % #",
    "Café, naïve, résumé, Über, Straße, façade, jalapeño, smörgåsbord.",
    "日本語のテキスト、中文文本 한국어 텍스트.",
    "Emoji: 🙂 🚀 🎉 ✨ 👍🏽 — dashes and “quotes” too.",
)

_TINY_TOKENIZER_VOCAB_SIZE = 512

# Shapes per size. "tiny" keeps unit tests fast; "bench" is big enough that matmuls,
# not Python overhead, dominate a step on a CPU.
_SIZES: dict[str, dict[str, int]] = {
    "tiny": {
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
    },
    "bench": {
        "hidden_size": 512,
        "intermediate_size": 1408,
        "num_hidden_layers": 8,
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
    },
}

# A larger-than-usual init spreads the logits of a random model far apart, so greedy
# argmax does not flip between tied tokens when batching changes float rounding.
_INITIALIZER_RANGE = 0.2


@contextmanager
def torch_threads(num_threads: int) -> Iterator[None]:
    """Run the block with ``num_threads`` torch intra-op threads, then restore the setting.

    Tiny models gain nothing from several threads, and on a busy machine spinning threads
    slow them down severalfold, so tests run them on one.
    """
    previous = torch.get_num_threads()
    torch.set_num_threads(num_threads)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def build_tiny_tokenizer(directory: str | Path) -> Any:
    """Train a small byte-level BPE tokenizer offline and save it into ``directory``.

    Returns the ``PreTrainedTokenizerFast``; it has BOS/EOS/PAD tokens, adds BOS when
    encoding, and carries :data:`TINY_CHAT_TEMPLATE` as its chat template.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=_TINY_TOKENIZER_VOCAB_SIZE,
        special_tokens=[PAD_TOKEN, BOS_TOKEN, EOS_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(_TOKENIZER_CORPUS, trainer=trainer)
    bos_id = backend.token_to_id(BOS_TOKEN)
    backend.post_processor = processors.TemplateProcessing(
        single=f"{BOS_TOKEN} $A",
        pair=f"{BOS_TOKEN} $A $B",
        special_tokens=[(BOS_TOKEN, bos_id)],
    )
    tokenizer = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=backend,
        bos_token=BOS_TOKEN,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        clean_up_tokenization_spaces=False,
    )
    tokenizer.chat_template = TINY_CHAT_TEMPLATE
    tokenizer.save_pretrained(str(directory))
    return tokenizer


def build_tiny_llama(
    directory: str | Path,
    *,
    seed: int = 0,
    size: ModelSize = "tiny",
    max_shard_size: str = "50GB",
    **overrides: Any,
) -> Path:
    """Write a random Llama checkpoint (float32, safetensors) with a tokenizer; return its path.

    ``overrides`` go to ``LlamaConfig`` (for example ``rope_scaling={...}``,
    ``tie_word_embeddings=True`` or ``num_hidden_layers=4``); ``size="bench"`` picks a
    bigger shape (hidden 512, 8 layers) for benchmarks; a small ``max_shard_size`` (such
    as ``"100KB"``) writes a sharded checkpoint with an index file.
    """
    from transformers import LlamaConfig, LlamaForCausalLM

    return _build(
        directory,
        LlamaConfig,
        LlamaForCausalLM,
        seed=seed,
        size=size,
        max_shard_size=max_shard_size,
        **overrides,
    )


def build_tiny_qwen3(
    directory: str | Path,
    *,
    seed: int = 0,
    size: ModelSize = "tiny",
    max_shard_size: str = "50GB",
    **overrides: Any,
) -> Path:
    """Write a random Qwen3 checkpoint (q_norm/k_norm, explicit head_dim); return its path.

    Same knobs as :func:`build_tiny_llama`; ``overrides`` go to ``Qwen3Config``.
    """
    from transformers import Qwen3Config, Qwen3ForCausalLM

    defaults: dict[str, Any] = {"head_dim": 32, "rope_theta": 1_000_000.0}
    return _build(
        directory,
        Qwen3Config,
        Qwen3ForCausalLM,
        seed=seed,
        size=size,
        max_shard_size=max_shard_size,
        **(defaults | overrides),
    )


def build_tiny_qwen2(
    directory: str | Path,
    *,
    seed: int = 0,
    size: ModelSize = "tiny",
    max_shard_size: str = "50GB",
    **overrides: Any,
) -> Path:
    """Write a random Qwen2 checkpoint (bias on q/k/v projections); return its path.

    Same knobs as :func:`build_tiny_llama`; ``overrides`` go to ``Qwen2Config``.
    """
    from transformers import Qwen2Config, Qwen2ForCausalLM

    return _build(
        directory,
        Qwen2Config,
        Qwen2ForCausalLM,
        seed=seed,
        size=size,
        max_shard_size=max_shard_size,
        **overrides,
    )


def build_tiny_mistral(
    directory: str | Path,
    *,
    seed: int = 0,
    size: ModelSize = "tiny",
    max_shard_size: str = "50GB",
    **overrides: Any,
) -> Path:
    """Write a random Mistral checkpoint (sliding-window attention); return its path.

    Same knobs as :func:`build_tiny_llama`; ``overrides`` go to ``MistralConfig``. The
    default window is 16 tokens so that short test prompts already slide.
    """
    from transformers import MistralConfig, MistralForCausalLM

    defaults: dict[str, Any] = {"sliding_window": 16}
    return _build(
        directory,
        MistralConfig,
        MistralForCausalLM,
        seed=seed,
        size=size,
        max_shard_size=max_shard_size,
        **(defaults | overrides),
    )


def _build(
    directory: str | Path,
    config_cls: Any,
    model_cls: Any,
    *,
    seed: int,
    size: ModelSize,
    max_shard_size: str,
    **overrides: Any,
) -> Path:
    """Shared body of the builders: tokenizer first, so the vocab matches it exactly."""
    from transformers import GenerationConfig

    if size not in _SIZES:
        raise ValueError(f"size must be one of {sorted(_SIZES)}, got {size!r}")
    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tiny_tokenizer(path)
    settings: dict[str, Any] = {
        **_SIZES[size],
        "vocab_size": len(tokenizer),
        "max_position_embeddings": 1024,
        "initializer_range": _INITIALIZER_RANGE,
        "rms_norm_eps": 1e-6,
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
        "tie_word_embeddings": False,
    }
    settings.update(overrides)
    config = config_cls(**settings)
    # Seed a private generator state so building a checkpoint does not disturb the
    # caller's global RNG and the weights depend only on ``seed``.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = model_cls(config).to(torch.float32).eval()
    model.generation_config = GenerationConfig(  # type: ignore[no-untyped-call]
        bos_token_id=config.bos_token_id,
        eos_token_id=config.eos_token_id,
        pad_token_id=config.pad_token_id,
        do_sample=False,
    )
    model.save_pretrained(str(path), max_shard_size=max_shard_size)
    return path


_CROSS_ENCODER_TEXT = (
    "the a of and to in is cat dog fox sat on mat quick brown jumps over lazy what which "
    "where who how paris france capital city river batch queue model"
)


def build_wordpiece_tokenizer(vocab: list[str], *, model_max_length: int) -> Any:
    """A BERT-style (lower-case WordPiece, `[CLS] a [SEP] b [SEP]`) fast tokenizer over
    `vocab`, built with `tokenizers` itself: transformers' own `BertTokenizer` constructor
    changed between major versions (5.x ignores `vocab_file=`, leaving every word unknown)."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    ids = {token: i for i, token in enumerate(vocab)}
    backend = Tokenizer(models.WordPiece(ids, unk_token="[UNK]"))
    backend.normalizer = normalizers.BertNormalizer(lowercase=True)
    backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    backend.post_processor = processors.BertProcessing(
        ("[SEP]", ids["[SEP]"]), ("[CLS]", ids["[CLS]"])
    )
    backend.decoder = decoders.WordPiece()
    return PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=backend, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]",
        sep_token="[SEP]", mask_token="[MASK]", model_max_length=model_max_length,
        model_input_names=["input_ids", "token_type_ids", "attention_mask"],
    )  # fmt: skip


def build_tiny_cross_encoder(directory: str | Path, *, seed: int = 0) -> Path:
    """Write a random BERT cross-encoder (one label) with a WordPiece tokenizer; no download.

    Loads in sentence-transformers' ``CrossEncoder`` and in Conveyor's ``kind: rerank``.
    """
    from transformers import BertConfig, BertForSequenceClassification

    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    words = _CROSS_ENCODER_TEXT.split(" ")
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words]
    vocab += [f"##{letter}" for letter in "abcdefghijklmnopqrstuvwxyz"] + list(
        "abcdefghijklmnopqrstuvwxyz?.,"
    )
    build_wordpiece_tokenizer(vocab, model_max_length=128).save_pretrained(str(path))
    config: Any = BertConfig(
        vocab_size=len(vocab), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=48, max_position_embeddings=128,
        initializer_range=_INITIALIZER_RANGE,
    )  # fmt: skip
    config.num_labels = 1
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model: Any = BertForSequenceClassification(config)
    model.eval()
    model.save_pretrained(str(path))
    return path


LORA_TARGET_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def build_lora_adapter(
    base: str | Path,
    directory: str | Path,
    *,
    rank: int = 8,
    alpha: int = 16,
    seed: int = 0,
    target_modules: tuple[str, ...] = LORA_TARGET_MODULES,
    use_rslora: bool = False,
    scale: float = 0.1,
) -> Path:
    """Write a PEFT LoRA adapter for the checkpoint at ``base``; return its directory.

    PEFT starts ``lora_B`` at zero (the adapter changes nothing); here every ``lora_A``
    and ``lora_B`` is drawn from N(0, ``scale``^2) instead, so the adapter changes the
    model's output and tests comparing with a merged model can fail.
    """
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model: Any = AutoModelForCausalLM.from_pretrained(str(base))
    config = LoraConfig(
        r=rank,
        lora_alpha=alpha,
        target_modules=list(target_modules),
        lora_dropout=0.0,
        use_rslora=use_rslora,
        task_type="CAUSAL_LM",
    )
    peft_model: Any = get_peft_model(model, config)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_A" in name or "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * scale)
    path = Path(directory)
    peft_model.save_pretrained(str(path))
    return path
