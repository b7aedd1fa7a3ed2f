"""The built-in offline task: arithmetic a small model cannot do in its head but one line of Python can.

Deterministic for a seed; every answer is an exact integer. Used by the smoke recipe, so that the
effect ReTool is about (learning to call the interpreter) shows up on a laptop CPU in minutes.
Difficulty 1..5 scales the sizes of the numbers.
"""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Callable, Iterator
from typing import Any

from retool_cli.config import SyntheticConfig
from retool_cli.errors import ConfigError

# A generated problem: (question, answer, a program that prints the answer). The program is written from the
# same numbers as the question, for the SFT traces that call the interpreter.
Problem = tuple[str, int, str]


def _digits(rng: random.Random, n: int) -> int:
    return rng.randint(10 ** (n - 1), 10**n - 1)


def product(rng: random.Random, d: int) -> Problem:
    a, b = _digits(rng, 3 + d), _digits(rng, 2 + d)
    return f"What is {a} * {b}?", a * b, f"print({a} * {b})"


def modpow(rng: random.Random, d: int) -> Problem:
    a, e, m = rng.randint(3, 10 ** (1 + d)), rng.randint(10 * d, 99 * d), rng.randint(7, 10 ** (1 + d))
    return f"What is the remainder when {a}^{e} is divided by {m}?", pow(a, e, m), f"print(pow({a}, {e}, {m}))"


def digit_sum_power(rng: random.Random, d: int) -> Problem:
    a, e = rng.randint(2, 9 + 10 * d), rng.randint(10 + 5 * d, 40 + 30 * d)
    code = f"print(sum(int(d) for d in str({a} ** {e})))"
    return f"What is the sum of the digits of {a}^{e}?", sum(int(c) for c in str(a**e)), code


def divisor_count(rng: random.Random, d: int) -> Problem:
    n = _digits(rng, 2 + d)
    count = sum(2 if i * i != n else 1 for i in range(1, math.isqrt(n) + 1) if n % i == 0)
    code = f"n = {n}\nprint(sum(1 for d in range(1, n + 1) if n % d == 0))"
    return f"How many positive divisors does {n} have?", count, code


def gcd(rng: random.Random, d: int) -> Problem:
    g = _digits(rng, 1 + d)
    a, b = g * _digits(rng, 2 + d), g * _digits(rng, 2 + d)
    code = f"import math\nprint(math.gcd({a}, {b}))"
    return f"What is the greatest common divisor of {a} and {b}?", math.gcd(a, b), code


def lcm(rng: random.Random, d: int) -> Problem:
    a, b = _digits(rng, 2 + d), _digits(rng, 2 + d)
    code = f"import math\nprint(math.lcm({a}, {b}))"
    return f"What is the least common multiple of {a} and {b}?", math.lcm(a, b), code


def binomial(rng: random.Random, d: int) -> Problem:
    n = rng.randint(15, 20 + 15 * d)
    k = rng.randint(3, n // 2)
    code = f"import math\nprint(math.comb({n}, {k}))"
    return f"In how many ways can {k} items be chosen from {n} distinct items?", math.comb(n, k), code


def power_sum(rng: random.Random, d: int) -> Problem:
    p, n = rng.randint(2, 2 + d), rng.randint(50, 100 * d + 50)
    code = f"print(sum(i ** {p} for i in range(1, {n} + 1)))"
    return f"What is the sum of i^{p} for i from 1 to {n}?", sum(i**p for i in range(1, n + 1)), code


def linear_system(rng: random.Random, d: int) -> Problem:
    bound = 20 * d
    x, y = rng.randint(-bound, bound), rng.randint(-bound, bound)
    while True:
        a, b, c, e = (rng.choice([i for i in range(-9 * d, 9 * d + 1) if i != 0]) for _ in range(4))
        if a * e - b * c != 0:
            break
    question = f"Solve the system {a}*x + {b}*y = {a * x + b * y} and {c}*x + {e}*y = {c * x + e * y}. What is x + y?"
    code = (
        f"import sympy\nx, y = sympy.symbols('x y')\ns = sympy.solve([{a}*x + {b}*y - ({a * x + b * y}), "
        f"{c}*x + {e}*y - ({c * x + e * y})], [x, y])\nprint(s[x] + s[y])"
    )
    return question, x + y, code


KINDS: dict[str, Callable[[random.Random, int], Problem]] = {
    f.__name__: f
    for f in (product, modpow, digit_sum_power, divisor_count, gcd, lcm, binomial, power_sum, linear_system)
}


def generate(cfg: SyntheticConfig, seed: int) -> Iterator[tuple[str, str, str, str]]:
    """`cfg.num_examples` distinct (id, question, answer, solution code) rows; kinds take turns so that every
    kind is equally common. A kind whose problem space is too small for the request raises."""
    unknown = [k for k in cfg.kinds if k not in KINDS]
    if unknown or not cfg.kinds:
        raise ConfigError(f"data.synthetic.kinds: unknown {unknown or 'empty list'}; available: {', '.join(KINDS)}")
    rng = random.Random(f"retool-synthetic-{seed}")
    seen: set[str] = set()
    for index in range(cfg.num_examples):
        kind = cfg.kinds[index % len(cfg.kinds)]
        for _ in range(1000):
            question, answer, code = KINDS[kind](rng, cfg.difficulty)
            if question not in seen:
                break
        else:
            raise ConfigError(
                f"data.synthetic.num_examples={cfg.num_examples}: kind {kind!r} ran out of distinct problems "
                f"at difficulty {cfg.difficulty}; ask for fewer examples or a higher difficulty"
            )
        seen.add(question)
        digest = hashlib.sha1(question.encode()).hexdigest()[:12]
        yield f"{kind}-{digest}", question, str(answer), code


def generate_rows(cfg: SyntheticConfig, seed: int, name: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """Generated problems as (where, fields) source rows, so they go through the same cleaning and dedupe as
    files (dataset.py wraps them as RawRow)."""
    for index, (example_id, question, answer, code) in enumerate(generate(cfg, seed)):
        yield f"{name} item {index}", {"id": example_id, "problem": question, "answer": answer, "solution_code": code}
