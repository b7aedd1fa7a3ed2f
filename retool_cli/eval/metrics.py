"""Evaluation statistics: pass@k, avg@k with labelled standard errors, bootstrap intervals, maj@k.

On a 30-problem benchmark one problem is 3.3 points, so every accuracy comes with its uncertainty:
the sampling error (what more samples of these same problems would remove) and the error over
problems (what a different draw of problems would change), reported separately.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k (Chen et al. 2021): 1 - C(n-c, k) / C(n, k), as a stable product."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass_at_k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def k_values(n: int) -> list[int]:
    """1, 2, 4, ... up to n (and n itself)."""
    ks = [2**i for i in range(int(math.log2(n)) + 1)] if n >= 1 else []
    return ks + ([n] if n not in ks else [])


@dataclass
class Accuracy:
    mean: float  # avg@n: mean over problems of the share of correct samples (the pass@1 estimate)
    se_sampling: float  # standard error from the finite samples per problem, these problems fixed
    se_problems: float  # standard error over problems: spread of per-problem accuracy / sqrt(N)
    ci95: tuple[float, float]  # bootstrap 95% interval, problems resampled


def avg_at_k(correct: list[list[bool]], bootstrap: int = 2000, seed: int = 0) -> Accuracy:
    """`correct[i][j]`: sample j of problem i was right. Problems may have different sample counts."""
    rates = [sum(row) / len(row) for row in correct]
    n_problems = len(rates)
    mean = sum(rates) / n_problems
    # sampling: each p_i estimated from n_i samples, variance p(1-p)/(n_i-1) unbiased
    var_sampling = sum(p * (1 - p) / max(1, len(row) - 1) for p, row in zip(rates, correct, strict=True))
    se_sampling = math.sqrt(var_sampling) / n_problems
    spread = sum((p - mean) ** 2 for p in rates) / (n_problems - 1) if n_problems > 1 else 0.0
    se_problems = math.sqrt(spread / n_problems)
    rng = random.Random(seed)
    means = sorted(sum(rng.choices(rates, k=n_problems)) / n_problems for _ in range(bootstrap))
    ci = (means[int(0.025 * (bootstrap - 1))], means[int(0.975 * (bootstrap - 1))])
    return Accuracy(mean, se_sampling, se_problems, ci)


@dataclass
class PairedDifference:
    """B - A over the problems both evaluations sampled, each problem's accuracies paired (the same problem is
    easy or hard for both: pairing removes that shared variation from the error)."""

    problems: int  # problems in common
    mean: float  # mean over problems of (accuracy in B - accuracy in A)
    se: float  # paired standard error: std over problems of the per-problem differences / sqrt(problems)
    ci95: tuple[float, float]  # paired bootstrap 95% interval: problems resampled together with both accuracies
    p_value: float  # two-sided sign-flip permutation test of "no difference" (each problem's difference negated
    # with probability 1/2 under the null); exact enumeration up to 16 problems, else `permutations` draws


def paired_difference(
    a: dict[str, float], b: dict[str, float], bootstrap: int = 2000, permutations: int = 10000, seed: int = 0
) -> PairedDifference:
    """`a`, `b`: problem id -> accuracy (share of right samples) of two evaluations; only common problems
    count. Deterministic for a seed."""
    common = [p for p in a if p in b]
    if not common:
        raise ValueError("paired_difference: the two evaluations share no problem")
    diffs = [b[p] - a[p] for p in common]
    n = len(diffs)
    mean = sum(diffs) / n
    se = math.sqrt(sum((d - mean) ** 2 for d in diffs) / (n - 1) / n) if n > 1 else 0.0
    rng = random.Random(seed)
    means = sorted(sum(rng.choices(diffs, k=n)) / n for _ in range(bootstrap))
    ci = (means[int(0.025 * (bootstrap - 1))], means[int(0.975 * (bootstrap - 1))])
    return PairedDifference(n, mean, se, ci, sign_flip_p_value(diffs, permutations, seed))


def sign_flip_p_value(diffs: list[float], permutations: int = 10000, seed: int = 0) -> float:
    """Two-sided p-value of "the paired differences are centred on zero": the share of sign assignments whose
    |sum| reaches the observed one. Exact (every assignment) up to 16 non-zero differences, else `permutations`
    seeded draws ((hits + 1) / (draws + 1))."""
    import numpy as np

    nonzero = np.array([d for d in diffs if d != 0], dtype=np.float64)  # a zero difference flips to itself
    if not len(nonzero):
        return 1.0
    observed = abs(nonzero.sum()) * (1 - 1e-9)  # the same terms summed in another order may differ in the last bit
    if len(nonzero) <= 16:
        masks = np.arange(1 << len(nonzero))[:, None] >> np.arange(len(nonzero)) & 1  # (2^n, n)
        return float((np.abs((2 * masks - 1) @ nonzero) >= observed).mean())
    signs = np.random.default_rng(seed).integers(0, 2, size=(permutations, len(nonzero))) * 2 - 1  # (P, n)
    return float(((np.abs(signs @ nonzero) >= observed).sum() + 1) / (permutations + 1))


def majority_answer(answers: list[str | None], equivalent: Callable[[str, str], bool]) -> str | None:
    """The most common answer, counting equivalent answers as one ("1/2" and "0.5"). Ties go to the
    answer seen first; samples without an answer do not vote."""
    clusters: list[list[str]] = []
    for answer in answers:
        if answer is None:
            continue
        for cluster in clusters:
            if equivalent(cluster[0], answer):
                cluster.append(answer)
                break
        else:
            clusters.append([answer])
    if not clusters:
        return None
    return max(clusters, key=len)[0]  # max keeps the first of equal lengths


def mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0
