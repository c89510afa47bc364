"""The batched sampler: one token per row of logits, each row with its own parameters.

Logits are first reshaped (``logits``: bias, repeat penalties, a grammar's
mask). Greedy rows take the exact argmax of the result. Other rows are scaled by
temperature, cut by top-k, top-p then min-p, and sampled with the exponential race
(``argmax(p / E)``, ``E ~ Exp(1)``), which draws a token with probability ``p``. A request
with a seed draws its noise from its own ``torch.Generator``, so its tokens depend only on
its own logits and seed, not on which other requests share the batch.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from conveyor.engine.outputs import TokenLogprobs
from conveyor.engine.sampling.logits import TokenHistory, shape_logits
from conveyor.engine.sampling.params import SamplingParams

__all__ = ["SampleResult", "Sampler", "new_generator"]

# Floor for the exponential noise, so a zero draw cannot divide by zero.
_MIN_NOISE = 1e-20


def new_generator(seed: int, device: str | torch.device = "cpu") -> torch.Generator:
    """A generator seeded once for one request; reuse it for all of that request's tokens."""
    generator = torch.Generator(device=device)
    generator.manual_seed(seed)
    return generator


@dataclass(frozen=True, slots=True)
class SampleResult:
    """One chosen token per row, and logprobs for rows whose params asked for them."""

    token_ids: list[int]
    logprobs: list[TokenLogprobs | None] = field(default_factory=list)


class Sampler:
    """Samples one token per row of a logits batch, each row with its own params."""

    def sample(
        self,
        logits: torch.Tensor,
        params: Sequence[SamplingParams],
        generators: Sequence[torch.Generator | None],
        *,
        histories: Sequence[TokenHistory | None] | None = None,
        allowed: torch.Tensor | None = None,
    ) -> SampleResult:
        """Pick a token per row of ``logits`` [N, V].

        ``generators[i]`` is row i's own seeded generator (see :func:`new_generator`) or
        None to use torch's global one. ``histories[i]`` feeds row i's repeat penalties;
        ``allowed`` (bool [N, V]) is what each row's grammar permits. Logprobs are of the
        raw logits, as OpenAI reports them.
        """
        if logits.dim() != 2 or logits.shape[0] != len(params) or len(params) != len(generators):
            raise ValueError("need logits [N, V] with one params and one generator per row")
        if not params:
            return SampleResult(token_ids=[], logprobs=[])
        logits = logits.to(torch.float32)
        shaped = shape_logits(logits, params, histories, allowed)
        chosen = shaped.argmax(dim=-1)
        random_rows = [row for row, p in enumerate(params) if not p.is_greedy]
        if random_rows:
            rows = torch.tensor(random_rows, device=logits.device)
            picked = self._sample_rows(
                shaped[rows],
                [params[row] for row in random_rows],
                [generators[row] for row in random_rows],
            )
            chosen[rows] = picked
        token_ids = [int(token) for token in chosen.tolist()]
        return SampleResult(token_ids=token_ids, logprobs=_logprobs(logits, token_ids, params))

    def _sample_rows(
        self,
        logits: torch.Tensor,
        params: Sequence[SamplingParams],
        generators: Sequence[torch.Generator | None],
    ) -> torch.Tensor:
        """Temperature, top-k, top-p, then the exponential race; returns token ids [n]."""
        temperatures = torch.tensor([p.temperature for p in params], device=logits.device)
        probs = _filtered_probs(logits / temperatures[:, None], params)
        unseeded = [row for row, generator in enumerate(generators) if generator is None]
        if len(unseeded) == len(generators):
            noise = _exponential(probs.shape, probs.device)
        else:
            noise = torch.empty_like(probs)
            if unseeded:
                noise[unseeded] = _exponential((len(unseeded), probs.shape[1]), probs.device)
        for row, generator in enumerate(generators):
            if generator is not None:
                # Drawn on the generator's own device so a CPU generator works with CUDA logits.
                row_noise = _exponential((probs.shape[1],), generator.device, generator)
                noise[row] = row_noise.to(probs.device)
        return (probs / noise.clamp_min(_MIN_NOISE)).argmax(dim=-1)


def _exponential(
    shape: Sequence[int], device: torch.device, generator: torch.Generator | None = None
) -> torch.Tensor:
    """Exp(1) draws as ``-log(U)``, ``U ~ Uniform[0, 1)`` (``U = 0`` gives inf: weight 0).

    The same distribution as ``Tensor.exponential_``, which measured about 9x slower on
    the CPU (124 ms against 14 ms for 16 rows of a 49k vocabulary): at temperature 1 it
    took a quarter of SmolLM2's decode step.
    """
    return torch.rand(tuple(shape), device=device, generator=generator).log_().neg_()


def _filtered_probs(scaled: torch.Tensor, params: Sequence[SamplingParams]) -> torch.Tensor:
    """Softmax of ``scaled`` logits with tokens outside each row's top-k / top-p / min-p zeroed."""
    probs = _top_k_top_p_probs(scaled, params)
    min_ps = [p.min_p for p in params]
    if not any(min_ps):
        return probs
    # min-p: drop tokens below min_p times the row's top probability, then renormalise.
    floor = (
        probs.max(dim=-1, keepdim=True).values * torch.tensor(min_ps, device=probs.device)[:, None]
    )
    probs = probs.masked_fill(probs < floor, 0.0)
    return probs / probs.sum(dim=-1, keepdim=True)


def _top_k_top_p_probs(scaled: torch.Tensor, params: Sequence[SamplingParams]) -> torch.Tensor:
    """Softmax of ``scaled`` with tokens outside each row's top-k / top-p zeroed."""
    vocab_size = scaled.shape[1]
    top_ks = [p.top_k if p.top_k > 0 else vocab_size for p in params]
    top_ps = [p.top_p for p in params]
    if all(k >= vocab_size for k in top_ks) and all(p >= 1.0 for p in top_ps):
        return torch.softmax(scaled, dim=-1)
    device = scaled.device
    sorted_logits, order = scaled.sort(dim=-1, descending=True)
    ranks = torch.arange(vocab_size, device=device)[None, :]
    is_removed = ranks >= torch.tensor(top_ks, device=device)[:, None]
    sorted_logits = sorted_logits.masked_fill(is_removed, -math.inf)
    sorted_probs = torch.softmax(sorted_logits, dim=-1)
    # Keep the smallest prefix whose mass reaches top_p: a token stays if the mass strictly
    # before it is below top_p, so the top token always stays.
    mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
    is_removed = mass_before >= torch.tensor(top_ps, device=device)[:, None]
    sorted_logits = sorted_logits.masked_fill(is_removed, -math.inf)
    filtered = torch.full_like(scaled, -math.inf).scatter(-1, order, sorted_logits)
    return torch.softmax(filtered, dim=-1)


def _logprobs(
    logits: torch.Tensor, token_ids: list[int], params: Sequence[SamplingParams]
) -> list[TokenLogprobs | None]:
    """Raw-distribution logprobs for the rows that asked; None for the others."""
    wanted = [row for row, p in enumerate(params) if p.logprobs is not None]
    results: list[TokenLogprobs | None] = [None] * len(params)
    if not wanted:
        return results
    rows = torch.tensor(wanted, device=logits.device)
    log_probs = torch.log_softmax(logits[rows], dim=-1)
    num_top = max(params[row].logprobs or 0 for row in wanted)
    top_values, top_ids = log_probs.topk(num_top, dim=-1) if num_top else (None, None)
    chosen = torch.tensor([token_ids[row] for row in wanted], device=logits.device)
    chosen_values = log_probs.gather(-1, chosen[:, None])[:, 0].tolist()
    top_values_list = top_values.tolist() if top_values is not None else None
    top_ids_list = top_ids.tolist() if top_ids is not None else None
    for index, row in enumerate(wanted):
        count = params[row].logprobs or 0
        top: tuple[tuple[int, float], ...] = ()
        if count and top_values_list is not None and top_ids_list is not None:
            top = tuple(
                zip(top_ids_list[index][:count], top_values_list[index][:count], strict=True)
            )
        results[row] = TokenLogprobs(
            token_id=token_ids[row], logprob=float(chosen_values[index]), top=top
        )
    return results
