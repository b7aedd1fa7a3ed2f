"""judge.py: reading a box's content as math, hedges, exact decimals; labelled pairs by category and
math-verify's own suite, judged through the real worker processes."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
import sympy

from retool_cli.env.judge import candidate_count, hedged, is_text, plain_math_verify, read_answer
from retool_cli.env.reward import Verifier

DATA = Path(__file__).resolve().parents[1] / "data"
CASES = [json.loads(line) for line in (DATA / "judge_cases.jsonl").read_text(encoding="utf-8").splitlines()]
SUITE = [json.loads(line) for line in (DATA / "math_verify_cases.jsonl").read_text(encoding="utf-8").splitlines()]


@pytest.fixture(scope="module")
def verifier():
    with Verifier(timeout_s=20.0, workers=2) as judge:
        yield judge


# ------------------------------------------------------------------ the labelled set


def test_labelled_set_covers_every_category_with_both_labels() -> None:
    assert len(CASES) >= 400
    assert len({row["id"] for row in CASES}) == len(CASES)
    by_category = Counter((row["category"], row["equal"]) for row in CASES)
    categories = {category for category, _ in by_category}
    assert {
        "signed_integers",
        "sums_and_polynomials",
        "complex_numbers",
        "lists_of_roots",
        "units_and_currency",
        "factorials",
        "equations",
        "sets_and_intervals",
        "hedges",
        "plain_numbers",
        "set_operations",
        "component_arithmetic",
        "named_values",
        "repeating_decimals",
        "mixed_in_percent_and_units",
    } <= categories
    for category in categories - {"hedges"}:
        assert by_category[(category, True)] and by_category[(category, False)], category
    assert all(row["how"] == "sympy" or row["how"].startswith("hand: ") for row in CASES)


def _sympy_equal(a, b) -> bool:
    a, b = (x.doit() if isinstance(x, sympy.Basic) else x for x in (a, b))  # sums of series, unevaluated sets
    if isinstance(a, (sympy.Tuple, sympy.MatrixBase)) or isinstance(b, (sympy.Tuple, sympy.MatrixBase)):
        return len(a) == len(b) and all(sympy.simplify(x - y) == 0 for x, y in zip(a, b, strict=True))
    if isinstance(a, sympy.Eq) and isinstance(b, sympy.Eq):  # the same equation, sides moved or scaled
        ratio = sympy.simplify((a.lhs - a.rhs) / (b.lhs - b.rhs))
        return ratio.is_number and ratio != 0
    if isinstance(a, sympy.Set) or isinstance(b, sympy.Set):
        return _simplified_set(a) == _simplified_set(b)
    return sympy.simplify(sympy.expand_complex(a - b)) == 0


def _simplified_set(s):
    if not isinstance(s, sympy.FiniteSet):
        return s
    return sympy.FiniteSet(*(sympy.nsimplify(e) if isinstance(e, sympy.Expr) else e for e in s))


@pytest.mark.parametrize("row", [r for r in CASES if r["how"] == "sympy"], ids=lambda r: r["id"])
def test_sympy_labels_recomputed(row: dict) -> None:
    names = {name: sympy.Symbol(name) for name in ("x", "y", "a", "b", "c", "r", "k")}
    gold, pred = (
        sympy.sympify(text.replace("{", "FiniteSet(").replace("}", ")") if text.startswith("{") else text, locals=names)
        for text in row["sympy"]
    )
    assert _sympy_equal(gold, pred) is row["equal"]


def test_every_labelled_pair_is_judged_right(verifier: Verifier) -> None:
    verdicts = verifier.verify_many([(row["gold"], row["pred"]) for row in CASES])
    wrong = [
        (row["id"], row["gold"], row["pred"])
        for row, v in zip(CASES, verdicts, strict=True)
        if v.equivalent is not row["equal"]
    ]
    assert not wrong
    assert not any(v.timed_out for v in verdicts)


def test_never_wrong_where_math_verify_is_right(verifier: Verifier) -> None:
    """On every labelled pair and math-verify's own suite: where either reading of math-verify gives the right
    verdict, ours gives it too."""
    import logging

    logging.getLogger("math_verify").setLevel(logging.ERROR)
    rows = [(r["gold"], r["pred"], r["equal"]) for r in CASES] + [(r["gold"], r["pred"], r["expected"]) for r in SUITE]
    ours = [v.equivalent for v in verifier.verify_many([(gold, pred) for gold, pred, _ in rows])]
    wrong = [
        (gold, pred, label)
        for (gold, pred, label), mine in zip(rows, ours, strict=True)
        if mine is not label and any(plain_math_verify(gold, pred, as_math) is label for as_math in (False, True))
    ]
    assert not wrong


def test_math_verify_suite_agreement(verifier: Verifier) -> None:
    """Whole responses (the suite's `pred`s) keep math-verify's own reading: 262/269, as math-verify 0.9.0."""
    verdicts = verifier.verify_many([(row["gold"], row["pred"]) for row in SUITE])
    agree = sum(v.equivalent is row["expected"] for row, v in zip(SUITE, verdicts, strict=True))
    assert agree >= 262


# ------------------------------------------------------------------ the rules, one by one


@pytest.mark.parametrize(
    ("answer", "count"),
    [
        ("5", 1),
        ("1, 2", 2),
        ("\\{1, 2, 3\\}", 3),
        ("(1, 2)", 2),
        ("[1, 2]", 1),
        ("\\pm 3", 2),
        ("1 \\pm \\sqrt{2}", 2),
        ("3 \\text{ or } 4", 2),
        ("x = 3 \\text{ and } y = 4", 2),
        ("25 \\text{ (or 26)}", 2),
        ("7 \\lor 8", 2),
        ("\\left\\{ 1, 2 \\right\\}", 2),
        ("f(1, 2)", 1),
        ("\\frac{1}{2}", 1),
        ("(1, 2), (3, 4)", 2),
        ("1; 2; 3", 3),
        ("\\text{either } 3 \\text{ or } 4", 2),
        ("7,425,000", 3),
    ],
)
def test_candidate_count(answer: str, count: int) -> None:
    assert candidate_count(answer) == count


def test_hedge_needs_a_reference_with_as_many_values() -> None:
    assert hedged("25", "25, 26") and hedged("25", "\\pm 25") and hedged("1, 2", "1, 2, 3")
    assert not hedged("1, 2", "2, 1") and not hedged("\\pm 3", "3, -3") and not hedged("5", "5")


@pytest.mark.parametrize(
    ("answer", "other", "read"),
    [
        ("7,425,000", "7425000", "7425000"),  # thousands against a number
        ("1,234", "1, 234", "1,234"),  # ... but a list against a list
        ("0,111", "0.111", "0.111"),  # a decimal comma only against a decimal (0,111 is no thousands grouping)
        ("1,5", "15", "1,5"),
        ("1 000", "1000", "1000"),
        ("10,\\!080", "10080", "10080"),
        ("1{,}000", "1000", "1000"),
        ("\u22125", "-5", "-5"),
        ("2\u00d73", "6", "2\\times 3"),
        ("1\\frac{4}{5}", "1.8", "(1+\\frac{4}{5})"),
        ("-2\\frac{1}{3}", "x", "-(2+\\frac{1}{3})"),
        ("2\\frac{3}{2}", "x", "2\\frac{3}{2}"),
        ("28 percent", "28\\%", "28"),  # the percent sign is a unit, as math-verify reads 28\\%
        ("33\\frac{1}{3}\\%", "\\frac{100}{3}\\%", "(33+\\frac{1}{3})"),  # a mixed number inside a percentage
        ("2\\frac{1}{3} \\text{ cm}", "\\frac{7}{3}", "(2+\\frac{1}{3})"),  # ... and before a unit
        ("0.\\overline{3}", "\\frac{1}{3}", "\\frac{1}{3}"),  # a repeating decimal is the fraction it spells
        ("-1.2\\overline{45}", "x", "-\\frac{137}{110}"),
        ("0.\\overline{9}", "1", "1"),
        ("0.1\\dot{6}", "x", "\\frac{1}{6}"),
        ("(x, y) = (1, -1)", "(1, -1)", "(1, -1)"),  # a named tuple against its values
        ("\\left(a, b\\right) = (2, 3)", "(2, 3)", "(2, 3)"),
        ("\\theta_1 = \\frac{\\pi}{3}", "\\frac{\\pi}{3}", "\\frac{\\pi}{3}"),
        ("x = 5", "x = 5", "x = 5"),  # against another equation it stays one
        ("x = 3, y = 4", "3", "x = 3, y = 4"),  # two values: a hedge against one, never cut to its first
        ("\\$4.50", "4.5", "4.50"),
        ("12 dollars", "12", "12"),
        ("\\varnothing", "\\emptyset", "\\emptyset"),
        ("\\text{no real solutions}", "\\emptyset", "\\emptyset"),
        ("\\{x \\mid x > 2\\}", "(2,\\infty)", "x > 2"),
        ("\\left\\{x : 1 \\le x \\le 3\\right\\}", "[1,3]", "1 \\le x \\le 3"),
        ("Navin", "\\text{Navin}", "\\text{Navin}"),
        ("5.", "5", "5"),
    ],
)
def test_read_answer_settles_plain_text_forms(answer: str, other: str, read: str) -> None:
    assert read_answer(answer, other) == read


def test_is_text_tells_a_response_from_a_box() -> None:
    assert is_text("The answer is $5$.") and is_text("so \\boxed{5}") and is_text("the number is not 10 which is 12")
    assert not is_text("\\$5") and not is_text("5 \\text{ dollars}") and not is_text("x = 25 \\text{ or } x = 26")


@pytest.mark.parametrize(("gold", "pred"), [("\\frac{1}{3}", "0.333333"), ("\\frac{1}{12}", "0.0833333333")])
def test_whole_responses_keep_math_verify_rounding(verifier: Verifier, gold: str, pred: str) -> None:
    """In `$...$` (a response, as math-verify's suite passes them) math-verify's 6-place rounding stands;
    the same values as a box's content are judged exactly (they are in the labelled set's hedges)."""
    assert verifier.is_equivalent(gold, f"The answer is ${pred}$.") is True
    assert verifier.is_equivalent(gold, pred) is False


PLUS_MINUS_AND_BRACED_SEPARATORS = [
    # a \pm inside an expression stands for its two values, against a list of both (either order, either side)
    ("\\frac{-3 \\pm \\sqrt{5}}{2}", "\\frac{-3+\\sqrt{5}}{2}, \\frac{-3-\\sqrt{5}}{2}", True),
    ("\\frac{1-\\sqrt{13}}{6}, \\frac{1+\\sqrt{13}}{6}", "\\frac{1 \\pm \\sqrt{13}}{6}", True),
    ("x = \\frac{5 \\pm \\sqrt{7}}{3}", "\\frac{5+\\sqrt7}{3}, \\frac{5-\\sqrt7}{3}", True),
    ("2 \\mp \\sqrt{2}", "2+\\sqrt2, 2-\\sqrt2", True),
    ("\\frac{-3 \\pm \\sqrt{5}}{2}", "\\frac{-3+\\sqrt{5}}{2}", False),  # one root of two
    ("\\frac{-3 \\pm \\sqrt{5}}{2}", "\\frac{3+\\sqrt{5}}{2}, \\frac{3-\\sqrt{5}}{2}", False),
    # {,} between a digit and three more separates thousands, also inside tuples and sets
    ("(1{,}000, 2{,}500)", "(1000, 2500)", True),
    ("\\{12{,}345, 6\\}", "\\{6, 12345\\}", True),
    ("(2500, 1000)", "(2{,}500, 1{,}000)", True),
    ("(1{,}000, 2{,}500)", "(1000, 2501)", False),
    ("(1{,}000, 2{,}500)", "(1, 0, 2, 500)", False),  # math-verify reads the separators as commas here
    ("3{,}14", "3.14", True),  # two digits after: a decimal comma, as before
]


@pytest.mark.parametrize(("gold", "pred", "equal"), PLUS_MINUS_AND_BRACED_SEPARATORS)
def test_plus_minus_expressions_and_braced_thousands_separators(
    verifier: Verifier, gold: str, pred: str, equal: bool
) -> None:
    [verdict] = verifier.verify_many([(gold, pred)])
    assert verdict.equivalent is equal
