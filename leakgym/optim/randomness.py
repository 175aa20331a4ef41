"""Per-problem randomness: one ``torch.Generator`` per problem, drawing its own block of rows.

A batched computation must give problem ``i`` the same random numbers whether it runs alone or beside
any other problems, so that a game's trajectory does not depend on the vector it runs in (the
counter-per-environment rule of batched simulators such as gymnax and Brax). One generator for the
whole batch cannot do that: a draw of ``(N, ...)`` values gives row ``i`` numbers that depend on N
and on the position of the problem. :class:`BatchedGenerator` holds one generator per problem and
draws every batched random tensor as one block per problem, concatenated along the leading dimension.

Problem ``i``'s generator is one stream, created by the attack with ``seeds[i]`` on the device of the
computation (:func:`seeded_generator`; a CPU generator cannot feed CUDA
tensors), and every draw of the problem continues it in a fixed order: initial images, DLG's label
logits, then per objective evaluation the PRECODE bottleneck noise and the E samples of the EOT
simulation, then any later stage of the attack (LODA's start image, the demixing start). The order
and shapes depend only on the attack's config and the problem itself, never on its neighbours.

Cost: one generator call per problem per draw (``N`` small calls instead of one); on a GPU that is
``N`` kernel launches per draw, a small price next to the double backward of the same iteration.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor

from leakgym.devices import canonical_device


def seeded_generator(seed: int, device: torch.device | str = "cpu") -> torch.Generator:
    """A ``torch.Generator`` on ``device`` (the device of the tensors it will feed), seeded with ``seed``."""
    g = torch.Generator(device=device)
    g.manual_seed(int(seed))
    return g


def _row_counts(rows_per_problem: int | Sequence[int], problems: int) -> list[int]:
    """Each problem's row count from one count or one per problem; ``ValueError`` otherwise."""
    counts = [rows_per_problem] * problems if isinstance(rows_per_problem, int) else list(rows_per_problem)
    if len(counts) != problems or not all(isinstance(c, int) and not isinstance(c, bool) and c >= 1 for c in counts):
        raise ValueError(f"rows_per_problem={rows_per_problem!r}; must be an integer >= 1 or one such "
                         f"integer per problem ({problems})")
    return counts


class BatchedGenerator:
    """One ``torch.Generator`` per problem; draws return ``rows_per_problem`` rows per problem.

    ``randn(shape)`` has shape ``(rows, *shape)``: problem ``i``'s generator draws the block
    ``(rows_i, *shape)`` that forms its rows (problems in order, each problem's rows contiguous: the
    engine's layout of N problems x their restarts). ``rows_per_problem`` is one count for every problem
    or one count per problem (problems with different restart counts). Every block is drawn on the
    generators' device, so nothing crosses devices.
    """

    def __init__(self, generators: Sequence[torch.Generator], *,
                 rows_per_problem: int | Sequence[int] = 1) -> None:
        self.generators = list(generators)
        if not self.generators:
            raise ValueError("BatchedGenerator needs at least one generator (one per problem)")
        devices = {canonical_device(g.device) for g in self.generators}
        if len(devices) != 1:
            raise ValueError(f"all generators must live on one device; got {sorted(map(str, devices))}")
        counts = _row_counts(rows_per_problem, len(self.generators))
        self.counts = counts
        self.rows_per_problem = rows_per_problem if isinstance(rows_per_problem, int) else tuple(counts)
        self.device = devices.pop()

    @classmethod
    def from_seeds(cls, seeds: Sequence[int], device: torch.device | str, *,
                   rows_per_problem: int | Sequence[int] = 1) -> BatchedGenerator:
        """Fresh generators on ``device``, problem ``i``'s seeded with ``seeds[i]``."""
        return cls([seeded_generator(s, device) for s in seeds], rows_per_problem=rows_per_problem)

    @property
    def n(self) -> int:
        """Number of problems."""
        return len(self.generators)

    @property
    def rows(self) -> int:
        """Leading size of every draw: the sum of the problems' row counts."""
        return sum(self.counts)

    def with_rows(self, rows_per_problem: int | Sequence[int]) -> BatchedGenerator:
        """The same generators (the streams continue) drawing ``rows_per_problem`` rows per problem."""
        counts = _row_counts(rows_per_problem, self.n)
        return self._derived(self.generators, counts,
                             rows_per_problem if isinstance(rows_per_problem, int) else tuple(counts))

    def subset(self, index: Sequence[int]) -> BatchedGenerator:
        """The generators of problems ``index`` (the streams continue), each with its row count."""
        index = list(index)
        if not index:
            raise ValueError("BatchedGenerator needs at least one generator (one per problem)")
        counts = [self.counts[i] for i in index]
        return self._derived([self.generators[i] for i in index], counts, tuple(counts))

    def _derived(self, generators: list[torch.Generator], counts: list[int],
                 rows_per_problem: int | tuple[int, ...]) -> BatchedGenerator:
        """A BatchedGenerator of some of these (checked) generators and checked row counts: the engine
        derives one per part and iteration, and checking every generator's device again cost about
        1 microsecond per generator each time."""
        out = object.__new__(BatchedGenerator)
        out.generators, out.counts, out.device = generators, counts, self.device
        out.rows_per_problem = rows_per_problem
        return out

    def randn(self, shape: Sequence[int], *, dtype: torch.dtype = torch.float32) -> Tensor:
        """Standard normal ``(rows, *shape)``, one block per problem."""
        return self._draw(torch.randn, shape, dtype)

    def rand(self, shape: Sequence[int], *, dtype: torch.dtype = torch.float32) -> Tensor:
        """Uniform ``[0, 1)`` ``(rows, *shape)``, one block per problem."""
        return self._draw(torch.rand, shape, dtype)

    def _draw(self, sample, shape: Sequence[int], dtype: torch.dtype) -> Tensor:
        shape = tuple(shape)
        return torch.cat([sample((c, *shape), generator=g, device=self.device, dtype=dtype)
                          for g, c in zip(self.generators, self.counts)])


# numpy's SeedSequence constants (O'Neill's seed_seq alternative, numpy/random/bit_generator.pyx)
_POOL_SIZE = 4
_INIT_A, _MULT_A = 0x43B0D7E5, 0x931E8875
_INIT_B, _MULT_B = 0x8B51F9DD, 0x58F38DED
_MIX_MULT_L, _MIX_MULT_R = 0xCA01F9DD, 0x4973F715
_XSHIFT = 16
_MASK32 = 0xFFFFFFFF


def _hash_constants() -> list[np.uint32]:
    """The hash constants of every ``hashmix`` of :func:`derived_seeds`, in order: they evolve the same
    way whatever the entropy (4 for the pool, 12 for the pairwise mixing)."""
    out, h = [], _INIT_A
    for _ in range(_POOL_SIZE + _POOL_SIZE * (_POOL_SIZE - 1)):
        out.append(h)
        h = (h * _MULT_A) & _MASK32
    return [np.uint32(c) for c in out]


_HASH_CONSTANTS = _hash_constants()


def derived_seeds(seeds: Sequence[int], stream: int) -> list[int]:
    """``int(np.random.SeedSequence([seed, stream]).generate_state(1)[0])`` for every seed, computed for
    all of them at once with numpy's SeedSequence arithmetic on uint32 arrays (one SeedSequence object
    per seed was about 13 microseconds a game, a round's host cost at N = 1,024 games). Seeds and
    ``stream`` are integers in ``[0, 2**32)`` (one entropy word each, as SeedSequence splits larger ones);
    tested equal to numpy's on random and edge seeds."""
    if not 0 <= stream <= _MASK32:
        raise ValueError(f"stream={stream}; allowed range 0..{_MASK32}")
    entropy = np.asarray(seeds, dtype=np.int64).reshape(-1)
    if entropy.size and (entropy.min() < 0 or entropy.max() > _MASK32):
        raise ValueError(f"seeds must be integers in 0..{_MASK32}; got {entropy.min()}..{entropy.max()}")
    words = [entropy.astype(np.uint32), np.full(entropy.size, stream, np.uint32)]
    words += [np.zeros(entropy.size, np.uint32)] * (_POOL_SIZE - len(words))
    constants = iter(_HASH_CONSTANTS)
    with np.errstate(over="ignore"):  # uint32 arithmetic wraps, as the C code's

        def hashmix(value: np.ndarray) -> np.ndarray:
            h = next(constants)
            value = (value ^ h) * np.uint32((int(h) * _MULT_A) & _MASK32)
            return value ^ (value >> np.uint32(_XSHIFT))

        def mix(x: np.ndarray, y: np.ndarray) -> np.ndarray:
            result = np.uint32(_MIX_MULT_L) * x - np.uint32(_MIX_MULT_R) * y
            return result ^ (result >> np.uint32(_XSHIFT))

        pool = [hashmix(w) for w in words]
        for src in range(_POOL_SIZE):
            for dst in range(_POOL_SIZE):
                if src != dst:
                    pool[dst] = mix(pool[dst], hashmix(pool[src]))
        state = (pool[0] ^ np.uint32(_INIT_B)) * np.uint32((_INIT_B * _MULT_B) & _MASK32)
        state = state ^ (state >> np.uint32(_XSHIFT))
    return state.tolist()


__all__ = ["BatchedGenerator", "derived_seeds", "seeded_generator"]
