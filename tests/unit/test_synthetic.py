"""The synthetic generator: deterministic, distinct problems, answers that recompute exactly."""

from __future__ import annotations

import math
import re

import pytest
import sympy

from retool_cli.config import SyntheticConfig
from retool_cli.data.synthetic import KINDS, generate
from retool_cli.errors import ConfigError


def recompute(question: str) -> int:
    """Solve a generated question independently of the generator (sympy where it has the function)."""
    n = [int(x) for x in re.findall(r"-?\d+", question)]
    if question.startswith("What is the remainder"):
        return pow(n[0], n[1], n[2])
    if "sum of the digits" in question:
        return sum(map(int, str(n[0] ** n[1])))
    if "positive divisors" in question:
        return int(sympy.divisor_count(n[0]))
    if "greatest common divisor" in question:
        return int(sympy.gcd(n[0], n[1]))
    if "least common multiple" in question:
        return int(sympy.lcm(n[0], n[1]))
    if "ways can" in question:
        return int(sympy.binomial(n[1], n[0]))
    if "sum of i^" in question:
        i = sympy.Symbol("i")
        return int(sympy.summation(i ** n[0], (i, n[1], n[2])))
    if "Solve the system" in question:
        x, y = sympy.symbols("x y")
        a, b, c, d, e, f = n[0], n[1], n[2], n[3], n[4], n[5]
        sol = sympy.solve([a * x + b * y - c, d * x + e * y - f], [x, y])
        return int(sol[x] + sol[y])
    if " * " in question:
        return n[0] * n[1]
    raise AssertionError(f"unrecognised question {question!r}")


@pytest.mark.parametrize("difficulty", [1, 3, 5])
def test_every_kind_answer_recomputes(difficulty: int) -> None:
    cfg = SyntheticConfig(num_examples=90, difficulty=difficulty, kinds=list(KINDS))
    for _, question, answer, _ in generate(cfg, seed=difficulty):
        assert int(answer) == recompute(question), question


def test_deterministic_distinct_and_balanced() -> None:
    cfg = SyntheticConfig(num_examples=400, kinds=["product", "modpow", "digit_sum_power", "divisor_count"])
    first, again, other = list(generate(cfg, 0)), list(generate(cfg, 0)), list(generate(cfg, 1))
    assert first == again
    assert first != other
    assert len({q for _, q, _, _ in first}) == 400
    counts = {kind: sum(i.startswith(kind) for i, _, _, _ in first) for kind in cfg.kinds}
    assert counts == dict.fromkeys(cfg.kinds, 100)


def test_difficulty_grows_numbers() -> None:
    easy = next(generate(SyntheticConfig(num_examples=1, difficulty=1, kinds=["product"]), 0))
    hard = next(generate(SyntheticConfig(num_examples=1, difficulty=5, kinds=["product"]), 0))
    assert math.log10(int(hard[2])) > math.log10(int(easy[2])) + 5


def test_unknown_kind_and_exhausted_space() -> None:
    with pytest.raises(ConfigError, match="unknown \\['nope'\\]; available: product"):
        list(generate(SyntheticConfig(kinds=["nope"]), 0))
    with pytest.raises(ConfigError, match="ran out of distinct problems"):
        list(generate(SyntheticConfig(num_examples=10_000, kinds=["digit_sum_power"]), 0))
