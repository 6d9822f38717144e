"""GABRA: the genetic algorithm of paper 003 (Akintoye et al. 2022, Algorithms 1-3) for placing
pipeline partitions on devices.

A chromosome has one gene per block: the device the block runs on (paper 003's ``x_ij``). It is
decoded into a pipeline placement by a repair that keeps what the genes say as far as a pipeline
allows: devices take stages in the order of their first gene, each with as many consecutive blocks
as it has genes (at least one). Algorithm 1: a feasible random initial population (Algorithm 2),
then each generation selects two parents by roulette wheel, crosses them at the mid point with
probability 0.8 (Algorithm 3), applies inversion mutation, draws again when the child is already in the
population, and replaces the population's worst with the child; ``t_max`` generations or
an optimal value end the search. The best
chromosome seen is returned.

Two objectives: ``"bottleneck"`` (fitness ``1 / bottleneck``, what sets pipeline throughput) and
``"paper"``, paper 003's 0-1 multiple-knapsack profit ``sum_i p_i / d_j`` over the stages, where
``p`` is a stage's compute load and ``d_j = speed_j * horizon`` the device's capacity in the same
units over ``horizon = (1 + slack) * total cost / total speed`` seconds; a chromosome that
overloads a capacity (eq. 6) or a memory has fitness 0.

With ``balance_cuts=True`` (the default for the bottleneck objective) each decoded chromosome's
stage boundaries are then moved to the best ones for its device order (an exact dynamic program),
and the improved chromosome is what enters the population: the GA searches device orders and
stage sizes, the program settles the boundaries. ``balance_cuts=False`` runs the GA as written.
"""

from __future__ import annotations

import bisect
import math
import time
from collections.abc import Sequence

import numpy as np

from lightning_hybrid.placement.problem import Placement, Problem


class GABRA:
    """The genetic search on one :class:`Problem`.

    Args:
        problem: blocks, devices and the number of stages.
        objective: ``"bottleneck"`` or ``"paper"``.
        population: chromosomes in the population.
        t_max: generations (one child each, as Algorithm 1).
        crossover_prob: probability of the mid-point crossover (0.8 in the paper).
        mutation_prob: probability that a child's gene segment is inverted.
        balance_cuts: move decoded stage boundaries to the best for the device order.
        slack: the ``"paper"`` objective's capacity horizon above the perfectly balanced time.
        patience: end the search after this many generations without a better chromosome
            (``None``: run all ``t_max``; on 300 random instances ``patience=1000`` ran 6.5x faster
            but left 13 placements more than 1% above the optimum instead of 4).
        polish: after the last generation, hill-climb from the best chromosome by swapping devices
            between stages (default: with ``balance_cuts``).
        seed: the random generator's seed; a seed gives the same placement every time.
    """

    def __init__(
        self,
        problem: Problem,
        objective: str = "bottleneck",
        population: int = 96,
        t_max: int = 5000,
        crossover_prob: float = 0.8,
        mutation_prob: float = 0.5,
        balance_cuts: bool | None = None,
        slack: float = 0.25,
        polish: bool | None = None,
        patience: int | None = None,
        seed: int = 0,
    ) -> None:
        if objective not in ("bottleneck", "paper"):
            raise ValueError(f"objective must be 'bottleneck' or 'paper', got {objective!r}")
        if population < 2 or t_max < 0:
            raise ValueError(f"population must be >= 2 and t_max >= 0, got {population} and {t_max}")
        if not (0 <= crossover_prob <= 1 and 0 <= mutation_prob <= 1):
            raise ValueError("crossover_prob and mutation_prob must be probabilities in [0, 1]")
        self.problem = problem
        self.objective = objective
        self.population_size = population
        self.t_max = t_max
        self.crossover_prob = crossover_prob
        self.mutation_prob = mutation_prob
        self.balance_cuts = (objective == "bottleneck") if balance_cuts is None else bool(balance_cuts)
        self.polish = self.balance_cuts if polish is None else bool(polish)
        if patience is not None and patience < 1:
            raise ValueError(f"patience must be >= 1 generation or None, got {patience}")
        self.patience = patience
        self.rng = np.random.default_rng(seed)
        speeds = np.array([d.speed for d in problem.devices])
        self.horizon = (1.0 + slack) * problem.cost_prefix[-1] / np.sort(speeds)[::-1][: problem.k].sum()
        self._cache: dict[bytes, tuple[float, np.ndarray]] = {}
        self._by_order: dict[tuple[int, ...], tuple[float, list[tuple[int, int]]]] = {}

    # ------------------------------------------------------------------ decoding
    def decode(self, genes: Sequence[int]) -> tuple[list[int], list[tuple[int, int]]]:
        """Device order and stage bounds a chromosome stands for (the repair described above)."""
        k, m = self.problem.k, self.problem.m
        genes = np.asarray(genes)
        _, first = np.unique(genes, return_index=True)
        order = [int(g) for g in genes[np.sort(first)][:k]]
        order += [d for d in range(m) if d not in order][: k - len(order)]
        counts = np.bincount(genes, minlength=m)[order].tolist()
        counts[int(np.argmax(counts))] += len(genes) - sum(counts)  # genes of devices left out
        for s in range(k):  # every stage gets at least one block
            while counts[s] < 1:
                counts[int(np.argmax(counts))] -= 1
                counts[s] += 1
        bounds, start = [], 0
        for c in counts:
            bounds.append((start, start + c))
            start += c
        return order, bounds

    @staticmethod
    def encode(order: Sequence[int], bounds: Sequence[tuple[int, int]]) -> np.ndarray:
        return np.concatenate([np.full(stop - start, d) for d, (start, stop) in zip(order, bounds)])

    def fitness_of(self, order: Sequence[int], bounds: Sequence[tuple[int, int]]) -> float:
        """Fitness of a decoded placement (larger is better; 0 when infeasible)."""
        p = self.problem
        loads = [p.cost_prefix[stop] - p.cost_prefix[start] for start, stop in bounds]
        memory = [p.stage_memory[start, stop] for start, stop in bounds]
        if any(mem > p.devices[d].memory for d, mem in zip(order, memory)):
            return 0.0
        if self.objective == "paper":
            capacity = [p.devices[d].speed * self.horizon for d in order]
            if any(load > cap * (1 + 1e-12) for load, cap in zip(loads, capacity)):
                return 0.0
            return float(sum(load / cap for load, cap in zip(loads, capacity)))
        bottleneck = max(sum(p.stage_time(start, stop, d)) for d, (start, stop) in zip(order, bounds))
        return 1.0 / bottleneck if bottleneck > 0 else math.inf

    def evaluate(self, genes: np.ndarray) -> tuple[float, np.ndarray]:
        """(fitness, repaired chromosome)."""
        key = np.asarray(genes, dtype=np.int64).tobytes()
        if key not in self._cache:
            order, bounds = self.decode(genes)
            if self.balance_cuts:  # the bounds then depend on the device order only
                known = self._by_order.get(tuple(order))
                if known is None:
                    _, best = self.problem.best_cuts(order)
                    bounds = best or bounds
                    known = self._by_order[tuple(order)] = (self.fitness_of(order, bounds), bounds)
                fitness, bounds = known
            else:
                fitness = self.fitness_of(order, bounds)
            self._cache[key] = (fitness, self.encode(order, bounds).astype(np.int64))
        fitness, repaired = self._cache[key]
        return fitness, repaired.copy()

    # ------------------------------------------------------------------ operators
    def random_chromosome(self) -> np.ndarray:
        """Algorithm 2: a random allocation of blocks to devices (repaired to a pipeline)."""
        p = self.problem
        order = list(self.rng.permutation(p.m)[: p.k])
        cuts = np.sort(self.rng.choice(np.arange(1, p.n), size=p.k - 1, replace=False)) if p.k > 1 else []
        edges = [0, *map(int, cuts), p.n]
        return self.encode(order, list(zip(edges[:-1], edges[1:])))

    def select(self, fitness: np.ndarray, cumulative: Sequence[float] | None = None) -> int:
        """Roulette wheel: an index drawn with probability proportional to fitness
        (``cumulative``: ``np.cumsum(fitness)`` as a list, when the caller has it)."""
        cumulative = np.cumsum(fitness).tolist() if cumulative is None else cumulative
        total = cumulative[-1]
        if not total > 0 or not math.isfinite(total):
            return int(self.rng.integers(len(fitness)))
        return min(bisect.bisect_right(cumulative, self.rng.random() * total), len(fitness) - 1)

    def crossover(self, a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Algorithm 3: mid-point crossover, two offspring."""
        cp = len(a) // 2
        return np.concatenate([a[:cp], b[cp:]]), np.concatenate([b[:cp], a[cp:]])

    def mutate(self, genes: np.ndarray) -> np.ndarray:
        """Inversion mutation: a random segment of genes in reverse order."""
        i, j = sorted(self.rng.choice(len(genes) + 1, size=2, replace=False))
        out = genes.copy()
        out[i:j] = out[i:j][::-1]
        return out

    def _polish(self, fitness: float, genes: np.ndarray) -> tuple[float, np.ndarray]:
        """Hill-climb from the GA's best: swap two stages' devices, or a stage's device for an unused
        one, while that improves the fitness."""
        improved = True
        while improved:
            improved = False
            order, bounds = self.decode(genes)
            unused = [d for d in range(self.problem.m) if d not in order]
            for s in range(len(order)):
                for other in [*order[s + 1:], *unused]:
                    trial = [other if d == order[s] else order[s] if d == other else d for d in order]
                    f, trial_genes = self.evaluate(self.encode(trial, bounds))
                    if f > fitness * (1 + 1e-12):
                        fitness, genes, improved = f, trial_genes, True
                        break
                if improved:
                    break
        return fitness, genes

    # ------------------------------------------------------------------ Algorithm 1
    def run(self) -> Placement:
        start = time.perf_counter()
        p = self.problem
        population, fitness = [], []
        attempts = 0
        while len(population) < self.population_size and attempts < 50 * self.population_size:
            attempts += 1
            f, genes = self.evaluate(self.random_chromosome())
            if f > 0 or attempts > 10 * self.population_size:
                population.append(genes)
                fitness.append(f)
        fitness_arr = np.array(fitness)
        best = int(np.argmax(fitness_arr))
        best_genes, best_fitness = population[best].copy(), fitness_arr[best]
        # The search also ends at a provable optimum: the lower bound on the bottleneck, or every capacity full.
        optimum = 1.0 / p.lower_bound() if self.objective == "bottleneck" else float(p.k)
        seen = {g.tobytes() for g in population}
        generation = last_improvement = 0
        while generation < self.t_max and best_fitness < optimum * (1 - 1e-9):
            if self.patience is not None and generation - last_improvement >= self.patience:
                break
            child = None
            cumulative = np.cumsum(fitness_arr).tolist()
            for _ in range(20):  # Algorithm 1, lines 7-11: a child already in the population is drawn again
                y1, y2 = population[self.select(fitness_arr, cumulative)], population[self.select(fitness_arr, cumulative)]
                w = self.crossover(y1, y2)[0] if self.rng.random() < self.crossover_prob else y1.copy()
                if self.rng.random() < self.mutation_prob:
                    w = self.mutate(w)
                f, w = self.evaluate(w)
                if w.tobytes() not in seen:
                    child = (f, w)
                    break
            generation += 1
            if child is None:
                continue
            f, w = child
            worst = int(np.argmin(fitness_arr))  # line 14: the child replaces the worst
            seen.discard(population[worst].tobytes())
            population[worst], fitness_arr[worst] = w, f
            seen.add(w.tobytes())
            if f > best_fitness:
                best_genes, best_fitness, last_improvement = w.copy(), f, generation
        if self.polish:
            best_fitness, best_genes = self._polish(best_fitness, best_genes)
        order, bounds = self.decode(best_genes)
        placement = p.placement(
            "gabra", order, bounds, seconds=time.perf_counter() - start, objective=self.objective,
            fitness=float(best_fitness), generations=generation,
        )
        return placement
