"""The built-in offline task: arithmetic a small model cannot do in its head but one line of Python can.

Deterministic for a seed; every answer is an exact integer. Used by the smoke recipe, so that the
effect ReTool is about (learning to call the interpreter) shows up on a laptop CPU in minutes.
Difficulty 1..5 scales the sizes of the numbers.
"""

from __future__ import annotations

import hashlib
import math
import random
import re
from collections.abc import Callable, Iterator

from retool_cli.config import SyntheticConfig
from retool_cli.errors import ConfigError


def _digits(rng: random.Random, n: int) -> int:
    return rng.randint(10 ** (n - 1), 10**n - 1)


def product(rng: random.Random, d: int) -> tuple[str, int]:
    a, b = _digits(rng, 3 + d), _digits(rng, 2 + d)
    return f"What is {a} * {b}?", a * b


def modpow(rng: random.Random, d: int) -> tuple[str, int]:
    a, e, m = rng.randint(3, 10 ** (1 + d)), rng.randint(10 * d, 99 * d), rng.randint(7, 10 ** (1 + d))
    return f"What is the remainder when {a}^{e} is divided by {m}?", pow(a, e, m)


def digit_sum_power(rng: random.Random, d: int) -> tuple[str, int]:
    a, e = rng.randint(2, 9 + 10 * d), rng.randint(10 + 5 * d, 40 + 30 * d)
    return f"What is the sum of the digits of {a}^{e}?", sum(int(c) for c in str(a**e))


def divisor_count(rng: random.Random, d: int) -> tuple[str, int]:
    n = _digits(rng, 2 + d)
    count = sum(2 if i * i != n else 1 for i in range(1, math.isqrt(n) + 1) if n % i == 0)
    return f"How many positive divisors does {n} have?", count


def gcd(rng: random.Random, d: int) -> tuple[str, int]:
    g = _digits(rng, 1 + d)
    a, b = g * _digits(rng, 2 + d), g * _digits(rng, 2 + d)
    return f"What is the greatest common divisor of {a} and {b}?", math.gcd(a, b)


def lcm(rng: random.Random, d: int) -> tuple[str, int]:
    a, b = _digits(rng, 2 + d), _digits(rng, 2 + d)
    return f"What is the least common multiple of {a} and {b}?", math.lcm(a, b)


def binomial(rng: random.Random, d: int) -> tuple[str, int]:
    n = rng.randint(15, 20 + 15 * d)
    k = rng.randint(3, n // 2)
    return f"In how many ways can {k} items be chosen from {n} distinct items?", math.comb(n, k)


def power_sum(rng: random.Random, d: int) -> tuple[str, int]:
    p, n = rng.randint(2, 2 + d), rng.randint(50, 100 * d + 50)
    return f"What is the sum of i^{p} for i from 1 to {n}?", sum(i**p for i in range(1, n + 1))


def linear_system(rng: random.Random, d: int) -> tuple[str, int]:
    bound = 20 * d
    x, y = rng.randint(-bound, bound), rng.randint(-bound, bound)
    while True:
        a, b, c, e = (rng.choice([i for i in range(-9 * d, 9 * d + 1) if i != 0]) for _ in range(4))
        if a * e - b * c != 0:
            break
    question = f"Solve the system {a}*x + {b}*y = {a * x + b * y} and {c}*x + {e}*y = {c * x + e * y}. What is x + y?"
    return question, x + y


KINDS: dict[str, Callable[[random.Random, int], tuple[str, int]]] = {
    f.__name__: f
    for f in (product, modpow, digit_sum_power, divisor_count, gcd, lcm, binomial, power_sum, linear_system)
}


def generate(cfg: SyntheticConfig, seed: int) -> Iterator[tuple[str, str, str]]:
    """`cfg.num_examples` distinct (id, question, answer) triples; kinds take turns so that every
    kind is equally common. A kind whose problem space is too small for the request raises."""
    unknown = [k for k in cfg.kinds if k not in KINDS]
    if unknown or not cfg.kinds:
        raise ConfigError(f"data.synthetic.kinds: unknown {unknown or 'empty list'}; available: {', '.join(KINDS)}")
    rng = random.Random(f"retool-synthetic-{seed}")
    seen: set[str] = set()
    for index in range(cfg.num_examples):
        kind = cfg.kinds[index % len(cfg.kinds)]
        for _ in range(1000):
            question, answer = KINDS[kind](rng, cfg.difficulty)
            if question not in seen:
                break
        else:
            raise ConfigError(
                f"data.synthetic.num_examples={cfg.num_examples}: kind {kind!r} ran out of distinct problems "
                f"at difficulty {cfg.difficulty}; ask for fewer examples or a higher difficulty"
            )
        seen.add(question)
        digest = hashlib.sha1(question.encode()).hexdigest()[:12]
        yield f"{kind}-{digest}", question, str(answer)


def solution_code(question: str) -> str:
    """A short program that answers a generated question (the code half of the SFT traces)."""
    n = [int(x) for x in re.findall(r"-?\d+", question)]
    if question.startswith("What is the remainder"):
        return f"print(pow({n[0]}, {n[1]}, {n[2]}))"
    if "sum of the digits" in question:
        return f"print(sum(int(d) for d in str({n[0]} ** {n[1]})))"
    if "positive divisors" in question:
        return f"n = {n[0]}\nprint(sum(1 for d in range(1, n + 1) if n % d == 0))"
    if "greatest common divisor" in question:
        return f"import math\nprint(math.gcd({n[0]}, {n[1]}))"
    if "least common multiple" in question:
        return f"import math\nprint(math.lcm({n[0]}, {n[1]}))"
    if "ways can" in question:
        return f"import math\nprint(math.comb({n[1]}, {n[0]}))"
    if "sum of i^" in question:
        return f"print(sum(i ** {n[0]} for i in range({n[1]}, {n[2]} + 1)))"
    if "Solve the system" in question:
        return (
            f"import sympy\nx, y = sympy.symbols('x y')\ns = sympy.solve([{n[0]}*x + {n[1]}*y - ({n[2]}), "
            f"{n[3]}*x + {n[4]}*y - ({n[5]})], [x, y])\nprint(s[x] + s[y])"
        )
    if " * " in question:
        return f"print({n[0]} * {n[1]})"
    raise ValueError(f"not a generated question: {question!r}")


def generate_rows(cfg: SyntheticConfig, seed: int, name: str) -> Iterator[tuple[str, dict]]:
    """Generated problems as (where, fields) source rows, so they go through the same cleaning and dedupe as
    files (dataset.py wraps them as RawRow)."""
    for index, (example_id, question, answer) in enumerate(generate(cfg, seed)):
        yield f"{name} item {index}", {"id": example_id, "problem": question, "answer": answer}
