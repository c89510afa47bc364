"""Rotary frequencies: the Llama 3 scaling against the plain ones."""

from __future__ import annotations

import math

import pytest
import torch

from conveyor.engine.model.hf_config import RopeSpec
from conveyor.engine.model.layers.rotary import inverse_frequencies

pytestmark = pytest.mark.model  # runs torch code: left out of mutation runs


def test_llama3_scaling_keeps_high_and_divides_low_frequencies() -> None:
    plain = inverse_frequencies(RopeSpec(rope_type="default", theta=10000.0), 64)
    llama3 = RopeSpec(
        rope_type="llama3", theta=10000.0, factor=8.0, original_max_position_embeddings=256
    )
    scaled = inverse_frequencies(llama3, 64)
    wavelengths = 2 * math.pi / plain
    is_short = wavelengths < 256 / 4.0
    is_long = wavelengths > 256 / 1.0
    torch.testing.assert_close(scaled[is_short], plain[is_short])
    torch.testing.assert_close(scaled[is_long], plain[is_long] / 8.0)
