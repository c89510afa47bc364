"""The batched sampler: one token per row of logits, each row with its own parameters.

Logits are first reshaped (``logits``: bias, repeat penalties, a grammar's mask). Greedy
rows take the exact argmax of the result (only those rows: on the CPU an argmax over a
49k vocabulary costs about as much as a whole inverse-CDF draw). Other rows are scaled by
temperature, cut by top-k, top-p then min-p, and token j is drawn with probability ``p_j``:

- Unseeded rows by inverse CDF (:func:`inverse_cdf`): one float64 uniform ``u`` per row,
  all from torch's global generator in one call, and the first token whose cumulative
  weight exceeds ``u`` times the row's total, found block by block so that each token
  keeps its share (a float32 cumulative sum would round the tail tokens' shares away:
  about 3e-4 of total variation on a 49k vocabulary).
- A seeded request with the exponential race, ``argmax(p / E)``, ``E ~ Exp(1)`` drawn per
  token from its own ``torch.Generator``: a draw per token, but stable. A row's logits
  can differ in their last bits with what shares its batch (a matmul's blocking follows
  the batch's size). The race's winner then changes only at a near tie, about as often as
  the total variation between the two (4e-7 for 1e-6 of jitter); an inverse-CDF draw
  moves with every earlier token's weight and would change hundreds of times as often.

A seeded row's draw is computed within the row (softmax and sort are per row, its noise
is its own, division is exact), so its tokens depend only on its own logits and seed, not
on which other requests share the batch.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from conveyor.engine.outputs import TokenLogprobs
from conveyor.engine.sampling.logits import TokenHistory, shape_logits
from conveyor.engine.sampling.params import SamplingParams

__all__ = ["SampleResult", "Sampler", "inverse_cdf", "new_generator"]

# Floor for the exponential noise, so a zero draw cannot divide by zero.
_MIN_NOISE = 1e-20
# Tokens per block of the inverse-CDF draw's first search (see inverse_cdf).
_BLOCK = 512


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
        logits = logits.to(torch.float32)  # the runner's logits are float32 already: no copy
        shaped = shape_logits(logits, params, histories, allowed)
        greedy_rows = [row for row, p in enumerate(params) if p.is_greedy]
        random_rows = [row for row, p in enumerate(params) if not p.is_greedy]
        token_ids = [0] * len(params)
        if greedy_rows:
            picked = _rows(shaped, greedy_rows).argmax(dim=-1).tolist()
            for row, token in zip(greedy_rows, picked, strict=True):
                token_ids[row] = int(token)
        if random_rows:
            picked = _sample_rows(
                _rows(shaped, random_rows),
                [params[row] for row in random_rows],
                [generators[row] for row in random_rows],
            ).tolist()
            for row, token in zip(random_rows, picked, strict=True):
                token_ids[row] = int(token)
        return SampleResult(token_ids=token_ids, logprobs=_logprobs(logits, token_ids, params))


def _rows(matrix: torch.Tensor, rows: list[int]) -> torch.Tensor:
    """``matrix`` itself when ``rows`` are all of its rows (no copy), else those rows."""
    if len(rows) == matrix.shape[0]:
        return matrix
    return matrix.index_select(0, torch.tensor(rows, device=matrix.device))


def _sample_rows(
    logits: torch.Tensor,
    params: Sequence[SamplingParams],
    generators: Sequence[torch.Generator | None],
) -> torch.Tensor:
    """Temperature, top-k, top-p and min-p, then the draw (see the module); token ids [n]."""
    temperatures = [p.temperature for p in params]
    if any(t != 1.0 for t in temperatures):
        # One pass into a new tensor (``logits`` may be the caller's); no cast, no copy first.
        logits = logits / torch.tensor(temperatures, device=logits.device)[:, None]
    weights = _filtered_probs(logits, params)
    device = weights.device
    seeded = [row for row, generator in enumerate(generators) if generator is not None]
    if not seeded:
        return inverse_cdf(weights, torch.rand(len(params), dtype=torch.float64, device=device))
    picked = torch.empty(len(params), dtype=torch.int64, device=device)
    unseeded = [row for row, generator in enumerate(generators) if generator is None]
    if unseeded:
        uniforms = torch.rand(len(unseeded), dtype=torch.float64, device=device)
        picked[unseeded] = inverse_cdf(_rows(weights, unseeded), uniforms)
    seeded_generators = [generator for generator in generators if generator is not None]
    picked[seeded] = _exponential_race(_rows(weights, seeded), seeded_generators)
    return picked


def _exponential_race(weights: torch.Tensor, generators: Sequence[torch.Generator]) -> torch.Tensor:
    """``argmax(w / E)``, ``E ~ Exp(1)`` drawn per token from each row's own generator:
    token j wins with probability ``w_j / sum(w)``. ``weights`` is overwritten."""
    noise = torch.empty_like(weights)
    for row, generator in enumerate(generators):
        # Drawn on the generator's own device so a CPU generator works with CUDA logits.
        noise[row] = _exponential((weights.shape[1],), generator.device, generator).to(noise.device)
    return weights.div_(noise.clamp_min_(_MIN_NOISE)).argmax(dim=-1)


def _exponential(
    shape: Sequence[int], device: torch.device, generator: torch.Generator | None = None
) -> torch.Tensor:
    """Exp(1) draws as ``-log(U)``, ``U ~ Uniform[0, 1)`` (``U = 0`` gives inf: weight 0).

    The same distribution as ``Tensor.exponential_``, which measured about 9x slower on
    the CPU (124 ms against 14 ms for 16 rows of a 49k vocabulary).
    """
    return torch.rand(tuple(shape), device=device, generator=generator).log_().neg_()


def inverse_cdf(weights: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """Token ids [n]: in row i, the first token whose cumulative weight exceeds
    ``uniforms[i]`` times the row's total, so token j with probability ``w_j / sum(w)``.

    ``weights`` [n, V] are unnormalised and >= 0; ``uniforms`` [n] are in [0, 1). The search
    has two levels: the cumulative sum of blocks of ``_BLOCK`` tokens picks a block, then
    that block's own cumulative sum (float64: every token keeps its share) picks the token
    at the same fraction of the block's mass. A float64 cumulative sum of the whole row
    would cost a full-size float64 matrix (at 64 rows of 49k, slower than the rest of the
    draw); a float32 one would round the tail tokens' shares away. A token or block of
    zero weight is a flat step, which ``right=True`` never stops on; where rounding puts
    a target at or past the end, the last token of positive weight is taken instead.
    """
    vocab_size = weights.shape[1]
    block = min(_BLOCK, vocab_size)
    block_sums = _block_sums(weights, block)
    block_cdf = block_sums.cumsum(dim=-1)
    targets = uniforms.to(torch.float64)[:, None] * block_cdf[:, -1:]
    blocks = _search(block_cdf, targets)
    below = torch.where(blocks > 0, block_cdf.gather(-1, (blocks - 1).clamp_min(0)), 0.0)
    fractions = ((targets - below) / block_sums.gather(-1, blocks)).clamp_(0.0, 1.0)
    ids = blocks * block + torch.arange(block, device=weights.device)
    if vocab_size % block:  # the last block is short: its ids past the vocabulary weigh 0
        inside = weights.gather(-1, ids.clamp_max(vocab_size - 1)).masked_fill_(
            ids >= vocab_size, 0.0
        )
    else:
        inside = weights.gather(-1, ids)
    inside_cdf = inside.cumsum(dim=-1, dtype=torch.float64)
    tokens = (blocks * block + _search(inside_cdf, fractions * inside_cdf[:, -1:])).clamp_max_(
        vocab_size - 1
    )
    misses = ~(weights.gather(-1, tokens) > 0)
    if bool(misses.any()):
        for row in misses.nonzero()[:, 0].tolist():
            tokens[row, 0] = _last_positive(weights[row], int(tokens[row, 0]))
    return tokens[:, 0]


def _block_sums(weights: torch.Tensor, block: int) -> torch.Tensor:
    """float64 [n, ceil(V / block)]: the sums of each row's blocks (the last one may be short)."""
    num_rows, vocab_size = weights.shape
    whole = vocab_size // block * block
    sums = weights[:, :whole].view(num_rows, -1, block).sum(dim=-1)
    if whole < vocab_size:
        sums = torch.cat([sums, weights[:, whole:].sum(dim=-1, keepdim=True)], dim=1)
    return sums.to(torch.float64)


def _search(cdf: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """[n, 1]: each row's first index whose ``cdf`` exceeds its target (the last index for
    a target at or past the end, or NaN)."""
    return torch.searchsorted(cdf, targets, right=True).clamp_max_(cdf.shape[1] - 1)


def _last_positive(weights: torch.Tensor, limit: int) -> int:
    """The last index of positive weight at or before ``limit``; else the first after it
    (0 in a row with none, e.g. one its grammar left no token)."""
    positive = (weights > 0).nonzero()[:, 0]
    if not len(positive):
        return 0
    before = positive[positive <= limit]
    return int(before[-1] if len(before) else positive[0])


def _filtered_probs(scaled: torch.Tensor, params: Sequence[SamplingParams]) -> torch.Tensor:
    """Softmax of ``scaled`` logits with tokens outside each row's top-k / top-p / min-p
    zeroed: unnormalised weights once min-p has cut (the draw needs no normalising)."""
    probs = _top_k_top_p_probs(scaled, params)
    min_ps = [p.min_p for p in params]
    if not any(min_ps):
        return probs
    # min-p: drop tokens below min_p times the row's top probability (in place: ``probs``
    # is the softmax's own output).
    floor = (
        probs.max(dim=-1, keepdim=True).values * torch.tensor(min_ps, device=probs.device)[:, None]
    )
    return probs.masked_fill_(probs < floor, 0.0)


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
