"""Whether two sets of figures order cells alike, each within its own noise.

Measured: a pair of cells counts as ordered only where the difference of their means is
larger than the run-to-run spread of both (``ordered_pairs``). Simulated: where the mean
over its seeds differs by more than twice the difference's standard error
(``simulated_pairs``). A tie on either side agrees with any order (``ordering``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


def spread(values: list[float]) -> float:
    """How far one cell's figure moved between runs with nothing changed (max - min)."""
    return max(values) - min(values) if values else 0.0


def ordered_pairs(measured: list[list[float]]) -> list[tuple[int, int, float]]:
    """The pairs of cells (i, j, sign of mean_i - mean_j) the runs order; ``measured[r][i]``
    is run r's figure for cell i. A pair is ordered when the difference of the cells'
    means exceeds the run-to-run spread of both cells (``spread``): a difference no larger
    than what one cell moves between two runs of the same profile is a tie. With one run
    the spread is unknown (0) and every unequal pair is ordered."""
    n = len(measured[0]) if measured else 0
    columns = [[run[i] for run in measured] for i in range(n)]
    means = [float(np.mean(c)) for c in columns]
    spreads = [spread(c) for c in columns]
    pairs = []
    for i in range(n):
        for j in range(i + 1, n):
            difference = means[i] - means[j]
            if abs(difference) > max(spreads[i], spreads[j]):
                pairs.append((i, j, float(np.sign(difference))))
    return pairs


def simulated_pairs(simulated: list[list[float]]) -> dict[tuple[int, int], float]:
    """The pairs of cells the simulation orders, ``(i, j) -> sign of mean_i - mean_j``;
    ``simulated[s][i]`` is seed s's figure for cell i. The compared figure is the mean
    over the seeds, so a pair is ordered when the means differ by more than twice the
    standard error of their difference (about 95% confidence); the spread over the
    seeds (unlike a few measured runs') would grow with more seeds instead of settling.
    With one seed every unequal pair is ordered."""
    n = len(simulated[0]) if simulated else 0
    columns = [np.asarray([seed[i] for seed in simulated], dtype=float) for i in range(n)]
    means = [float(c.mean()) for c in columns]
    k = len(simulated)
    variances = [float(c.var(ddof=1)) / k if k > 1 else 0.0 for c in columns]
    pairs = {}
    for i in range(n):
        for j in range(i + 1, n):
            difference = means[i] - means[j]
            if abs(difference) > 2 * float(np.sqrt(variances[i] + variances[j])):
                pairs[(i, j)] = float(np.sign(difference))
    return pairs


@dataclass(frozen=True, slots=True)
class Ordering:
    """How the simulation orders the pairs the measurement orders: alike, the other way,
    or as a tie (within its own seeds' noise, ``simulated_pairs``, which agrees with
    either order)."""

    cells: int
    ordered: int  # pairs the measurement orders; the rest are measured ties
    alike: int
    opposite: int
    tied: int

    @property
    def same(self) -> bool:
        return self.opposite == 0


def ordering(measured: list[list[float]], simulated: list[list[float]]) -> Ordering:
    """``measured[r][i]``: run r's figure for cell i; ``simulated[s][i]``: seed s's."""
    measured_pairs = ordered_pairs(measured)
    simulated_sign = simulated_pairs(simulated)
    alike = sum(simulated_sign.get((i, j)) == sign for i, j, sign in measured_pairs)
    opposite = sum(simulated_sign.get((i, j)) == -sign for i, j, sign in measured_pairs)
    n = len(measured[0]) if measured else 0
    return Ordering(n, len(measured_pairs), alike, opposite, len(measured_pairs) - alike - opposite)
