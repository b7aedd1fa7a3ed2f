"""Writes judge_cases.jsonl: labelled (reference, answer) pairs by category, for the judge's tests and the
accuracy table in benchmarks/README.md. Run it after editing the lists below: python tests/data/build_judge_cases.py

Every pair says how its label was checked: `sympy` pairs carry both values written as sympy expressions, and
tests/unit/test_judge.py recomputes the label with sympy; `hand` pairs say why (a hedge is wrong whatever its
values; a rewrite that keeps the value). Answers are a box's content, as the reward passes them to the judge.
"""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

HERE = Path(__file__).resolve().parent
S = "sympy"  # the label follows from the sympy expressions given with the pair


def sym(gold: str, pred: str, equal: bool, sgold: str, spred: str) -> dict:
    return {"gold": gold, "pred": pred, "equal": equal, "how": S, "sympy": [sgold, spred]}


def hand(gold: str, pred: str, equal: bool, why: str) -> dict:
    return {"gold": gold, "pred": pred, "equal": equal, "how": f"hand: {why}"}


def signed_integers() -> list[dict]:
    rows = []
    for gold, pred in [("5", "+5"), ("-5", "\u22125"), ("-12", "\u221212"), ("7", "+7"), ("-3", "- 3"), ("0", "-0"),
                       ("025", "25"), ("25", "025"), ("-7", "-(7)"), ("12", "+12"), ("-1", "\u22121"), ("100", "+100"),
                       ("-48", "\u221248"), ("4", "04"), ("-20", "\u221220"), ("9", "+ 9"), ("-250", "\u2212250"),
                       ("33", "+33"), ("-6", "-06"), ("+8", "8")]:  # fmt: skip
        rows.append(sym(gold, pred, True, _integer(gold), _integer(pred)))
    for gold, pred in [("5", "-5"), ("-5", "5"), ("5", "\u22125"), ("-5", "+5"), ("12", "21"), ("-12", "12"),
                       ("25", "26"), ("7", "\u22127"), ("100", "10"), ("3", "+4"), ("-48", "48"), ("0", "-1")]:  # fmt: skip
        rows.append(sym(gold, pred, False, _integer(gold), _integer(pred)))
    return rows


def _integer(text: str) -> str:
    """Python's spelling of a signed integer written with a Unicode minus, a plus sign or leading zeros."""
    text = text.replace("\u2212", "-").replace(" ", "")
    return str(int(text)) if text.lstrip("+-").isdigit() else text


def sums_and_polynomials() -> list[dict]:
    same = [("2x+3", "3+2x", "2*x+3", "3+2*x"), ("x^2+5x+6", "(x+2)(x+3)", "x**2+5*x+6", "(x+2)*(x+3)"),
            ("(x+2)(x+3)", "x^2+5x+6", "(x+2)*(x+3)", "x**2+5*x+6"), ("x^2-1", "(x-1)(x+1)", "x**2-1", "(x-1)*(x+1)"),
            ("a^2+2ab+b^2", "(a+b)^2", "a**2+2*a*b+b**2", "(a+b)**2"), ("3-2y", "-2y+3", "3-2*y", "-2*y+3"),
            ("x^3+3x-6", "3x-6+x^3", "x**3+3*x-6", "3*x-6+x**3"), ("6r^2-4r-24", "2(3r^2-2r-12)", "6*r**2-4*r-24", "2*(3*r**2-2*r-12)"),
            ("1+2\\sqrt{3}", "2\\sqrt{3}+1", "1+2*sqrt(3)", "2*sqrt(3)+1"), ("4x^2-9", "(2x-3)(2x+3)", "4*x**2-9", "(2*x-3)*(2*x+3)"),
            ("x^2-7x+12", "(x-3)(x-4)", "x**2-7*x+12", "(x-3)*(x-4)"), ("2x^2+x-1", "(2x-1)(x+1)", "2*x**2+x-1", "(2*x-1)*(x+1)"),
            ("\\frac{x+2}{7}", "\\frac{x}{7}+\\frac{2}{7}", "(x+2)/7", "x/7+2/7"), ("x^4-1", "(x^2+1)(x-1)(x+1)", "x**4-1", "(x**2+1)*(x-1)*(x+1)"),
            ("-x+5", "5-x", "-x+5", "5-x"), ("3(x+1)", "3x+3", "3*(x+1)", "3*x+3"), ("\\sqrt{2}+\\sqrt{3}", "\\sqrt{3}+\\sqrt{2}", "sqrt(2)+sqrt(3)", "sqrt(3)+sqrt(2)"),
            ("x^2+y^2", "y^2+x^2", "x**2+y**2", "y**2+x**2"), ("2\\pi+1", "1+2\\pi", "2*pi+1", "1+2*pi"), ("a+b+c", "c+b+a", "a+b+c", "c+b+a"),
            ("5r^5", "5 r^{5}", "5*r**5", "5*r**5"), ("x^2+2x+1", "(x+1)^2", "x**2+2*x+1", "(x+1)**2"), ("(x-2)^2", "x^2-4x+4", "(x-2)**2", "x**2-4*x+4"),
            ("x^3-8", "(x-2)(x^2+2x+4)", "x**3-8", "(x-2)*(x**2+2*x+4)"), ("2a-3b", "-3b+2a", "2*a-3*b", "-3*b+2*a"),
            ("\\frac{1}{2}x+1", "1+\\frac{x}{2}", "x/2+1", "1+x/2"), ("-2x^2+4x+3", "-2(x-1)^2+5", "-2*x**2+4*x+3", "-2*(x-1)**2+5"),
            ("3x^2+12x+10", "3(x+2)^2-2", "3*x**2+12*x+10", "3*(x+2)**2-2")]  # fmt: skip
    differ = [("2x+3", "3x+2", "2*x+3", "3*x+2"), ("x^2+5x+6", "(x+1)(x+6)", "x**2+5*x+6", "(x+1)*(x+6)"),
              ("x^2-1", "(x-1)^2", "x**2-1", "(x-1)**2"), ("3-2y", "2y-3", "3-2*y", "2*y-3"), ("(a+b)^2", "a^2+b^2", "(a+b)**2", "a**2+b**2"),
              ("x^3+3x-6", "x^3+3x+6", "x**3+3*x-6", "x**3+3*x+6"), ("4x^2-9", "(4x-3)(x+3)", "4*x**2-9", "(4*x-3)*(x+3)"),
              ("x^2-7x+12", "(x+3)(x+4)", "x**2-7*x+12", "(x+3)*(x+4)"), ("6r^2-4r-24", "6r^2-4r+24", "6*r**2-4*r-24", "6*r**2-4*r+24"),
              ("1+2\\sqrt{3}", "2+\\sqrt{3}", "1+2*sqrt(3)", "2+sqrt(3)"), ("-x+5", "x-5", "-x+5", "x-5"), ("(x-2)^2", "x^2-4", "(x-2)**2", "x**2-4"),
              ("x^3-8", "(x-2)^3", "x**3-8", "(x-2)**3"), ("2a-3b", "3b-2a", "2*a-3*b", "3*b-2*a")]  # fmt: skip
    return [sym(g, p, True, sg, sp) for g, p, sg, sp in same] + [sym(g, p, False, sg, sp) for g, p, sg, sp in differ]


def complex_numbers() -> list[dict]:
    same = [("3+4i", "4i+3", "3+4*I", "4*I+3"), ("1+2i", "2i+1", "1+2*I", "2*I+1"), ("1-12i", "-12i+1", "1-12*I", "-12*I+1"),
            ("6-5i", "-5i+6", "6-5*I", "-5*I+6"), ("1+\\sqrt{3}i", "2e^{i\\pi/3}", "1+sqrt(3)*I", "2*exp(I*pi/3)"),
            ("1+i", "\\sqrt{2}e^{i\\pi/4}", "1+I", "sqrt(2)*exp(I*pi/4)"), ("2i", "\\frac{2}{-i}", "2*I", "2/(-I)"),
            ("-i", "\\frac{(1+i)^2}{-2}", "-I", "(1+I)**2/(-2)"), ("i", "\\frac{1+i}{1-i}", "I", "(1+I)/(1-I)"), ("-1", "i^2", "-1", "I**2"),
            ("1", "i^4", "1", "I**4"), ("-8i", "(1+i)^6", "-8*I", "(1+I)**6"), ("5", "|3+4i|", "5", "Abs(3+4*I)"), ("\\sqrt{2}", "|1+i|", "sqrt(2)", "Abs(1+I)"),
            ("2+2i", "2(1+i)", "2+2*I", "2*(1+I)"), ("\\frac{1}{2}+\\frac{1}{2}i", "\\frac{1+i}{2}", "1/2+I/2", "(1+I)/2"),
            ("-1+i", "i-1", "-1+I", "I-1"), ("1+274i", "274i+1", "1+274*I", "274*I+1"), ("2", "(1+i)(1-i)", "2", "(1+I)*(1-I)"),
            ("i", "e^{i\\pi/2}", "I", "exp(I*pi/2)"), ("-1", "e^{i\\pi}", "-1", "exp(I*pi)"), ("\\frac{3}{5}+\\frac{4}{5}i", "\\frac{3+4i}{5}", "3/5+4*I/5", "(3+4*I)/5"),
            ("1+i", "\\sqrt{2}(\\cos\\frac{\\pi}{4}+i\\sin\\frac{\\pi}{4})", "1+I", "sqrt(2)*(cos(pi/4)+I*sin(pi/4))"),
            ("-2-2i", "-2(1+i)", "-2-2*I", "-2*(1+I)"), ("4i", "(1+i)^2 \\cdot 2", "4*I", "(1+I)**2*2"), ("3i-4", "-4+3i", "3*I-4", "-4+3*I"),
            ("\\frac{1}{2}-\\frac{\\sqrt{3}}{2}i", "e^{-i\\pi/3}", "1/2-sqrt(3)*I/2", "exp(-I*pi/3)"),
            ("1+\\sqrt{3}i", "2(\\cos 60^\\circ + i \\sin 60^\\circ)", "1+sqrt(3)*I", "2*(cos(pi/3)+I*sin(pi/3))"),
            ("13", "|5+12i|", "13", "Abs(5+12*I)"), ("3+4i", "(2+i)^2", "3+4*I", "(2+I)**2"), ("2-i", "\\frac{5}{2+i}", "2-I", "5/(2+I)")]  # fmt: skip
    differ = [("3+4i", "4+3i", "3+4*I", "4+3*I"), ("1+i", "1-i", "1+I", "1-I"), ("2i", "-2i", "2*I", "-2*I"),
              ("1+\\sqrt{3}i", "2e^{i\\pi/6}", "1+sqrt(3)*I", "2*exp(I*pi/6)"), ("5", "|3+5i|", "5", "Abs(3+5*I)"),
              ("i", "\\frac{1-i}{1+i}", "I", "(1-I)/(1+I)"), ("-1", "i^3", "-1", "I**3"), ("3-4i", "3+4i", "3-4*I", "3+4*I"),
              ("1+274i", "274+i", "1+274*I", "274+I"), ("-8i", "(1+i)^5", "-8*I", "(1+I)**5"), ("6-5i", "6+5i", "6-5*I", "6+5*I"),
              ("1-12i", "12i-1", "1-12*I", "12*I-1"), ("-1+i", "1-i", "-1+I", "1-I"), ("i", "e^{i\\pi}", "I", "exp(I*pi)"),
              ("1+\\sqrt{3}i", "2(\\cos 30^\\circ + i \\sin 30^\\circ)", "1+sqrt(3)*I", "2*(cos(pi/6)+I*sin(pi/6))")]  # fmt: skip
    return [sym(g, p, True, sg, sp) for g, p, sg, sp in same] + [sym(g, p, False, sg, sp) for g, p, sg, sp in differ]


def lists_of_roots() -> list[dict]:
    same = [("1, 2", "2, 1", "{1,2}", "{2,1}"), ("-2, 1", "1, -2", "{-2,1}", "{1,-2}"), ("1,2,3", "3, 2, 1", "{1,2,3}", "{3,2,1}"),
            ("-3, 3", "3, -3", "{-3,3}", "{3,-3}"), ("\\pm 3", "3, -3", "{3,-3}", "{3,-3}"), ("\\pm 3", "-3, 3", "{3,-3}", "{-3,3}"),
            ("1 \\pm \\sqrt{2}", "1+\\sqrt{2}, 1-\\sqrt{2}", "{1+sqrt(2),1-sqrt(2)}", "{1+sqrt(2),1-sqrt(2)}"), ("2, 5", "x=5, x=2", "{2,5}", "{5,2}"),
            ("2, 5", "5 \\text{ and } 2", "{2,5}", "{5,2}"), ("0, 1", "\\{1, 0\\}", "{0,1}", "{1,0}"), ("\\frac{1}{2}, -3", "-3, \\frac12", "{Rational(1,2),-3}", "{-3,Rational(1,2)}"),
            ("-2, 1", "x = 1 \\text{ or } x = -2", "{-2,1}", "{1,-2}"), ("1, 3, 5", "5, 1, 3", "{1,3,5}", "{5,1,3}"), ("-1, 1", "1, -1", "{-1,1}", "{1,-1}"),
            ("2 \\pm \\sqrt{3}", "2-\\sqrt{3}, 2+\\sqrt{3}", "{2+sqrt(3),2-sqrt(3)}", "{2-sqrt(3),2+sqrt(3)}"), ("\\{1, 2\\}", "2, 1", "{1,2}", "{2,1}"),
            ("-4, 2", "2 \\text{ and } -4", "{-4,2}", "{2,-4}"), ("0, \\frac{3}{2}", "\\frac32, 0", "{0,Rational(3,2)}", "{Rational(3,2),0}"),
            ("1, 2", "x_1 = 2, x_2 = 1", "{1,2}", "{2,1}")]  # fmt: skip
    differ = [("1, 2", "1, 3", "{1,2}", "{1,3}"), ("1, 2", "1, 2, 3", "{1,2}", "{1,2,3}"), ("1,2,3", "1,2", "{1,2,3}", "{1,2}"),
              ("-3, 3", "3", "{-3,3}", "{3}"), ("1, 2", "-1, -2", "{1,2}", "{-1,-2}"), ("\\pm 3", "3", "{3,-3}", "{3}"),
              ("1 \\pm \\sqrt{2}", "1+\\sqrt{2}", "{1+sqrt(2),1-sqrt(2)}", "{1+sqrt(2)}"), ("2, 5", "2, 6", "{2,5}", "{2,6}"),
              ("-2, 1", "2, -1", "{-2,1}", "{2,-1}"), ("0, 1", "0", "{0,1}", "{0}")]  # fmt: skip
    rows = [sym(g, p, True, sg, sp) for g, p, sg, sp in same] + [sym(g, p, False, sg, sp) for g, p, sg, sp in differ]
    for gold, pred in [("\\emptyset", "\\varnothing"), ("\\emptyset", "\\{\\}"), ("\\varnothing", "\\emptyset"),
                       ("\\emptyset", "\\text{no solution}"), ("\\emptyset", "\\text{no real solutions}"), ("\\{\\}", "\\varnothing"),
                       ("\\varnothing", "\\text{empty set}"), ("\\emptyset", "\u2205")]:  # fmt: skip
        rows.append(sym(gold, pred, True, "EmptySet", "EmptySet"))
    for gold, pred, spred in [
        ("\\emptyset", "0", "0"),
        ("\\emptyset", "\\{0\\}", "{0}"),
        ("\\varnothing", "\\{\\emptyset\\}", "{EmptySet}"),
    ]:
        rows.append(sym(gold, pred, False, "EmptySet", spred))
    return rows


def units_and_currency() -> list[dict]:
    rows = []
    for gold, pred in [("5", "\\$5"), ("5", "5 \\text{ dollars}"), ("1.5", "\\$1.50"), ("5", "5\\text{ cm}"), ("12", "12 \\text{ inches}"),
                       ("864", "864 \\mbox{ inches}^2"), ("5.4", "5.4 \\text{ cents}"), ("\\$32", "32"), ("90", "90^\\circ"), ("30^\\circ", "30"),
                       ("100", "100 \\text{ m}"), ("3", "3 \\text{ hours}"), ("7.78", "\\$7.78"), ("10", "10\\,\\text{cm}"), ("20", "20 dollars"),
                       ("45", "45\u00b0"), ("2.50", "\\$2.50"), ("15", "15 \\text{ cm}^2"), ("8", "8 \\text{ feet}"), ("40", "40\\%"),
                       ("28\\%", "28 \\text{ percent}"), ("28\\%", "28 percent"), ("55^\\circ", "55"), ("6", "6 \\text{ units}"), ("12", "12 \u20ac"), ("1000", "\\$1,000"), ("5", "5\\,\\mathrm{m/s}"),
                       ("15\\mbox{ cm}^2", "\\left(15 \\text{ cm}^2\\right)")]:  # fmt: skip
        rows.append(hand(gold, pred, True, "the same number with a unit, currency or percent mark"))
    for gold, pred in [("5", "\\$6"), ("5", "5.5 \\text{ cm}"), ("1.5", "\\$15"), ("90", "45^\\circ"), ("12", "13 \\text{ inches}"),
                       ("864", "846 \\mbox{ inches}^2"), ("7.78", "\\$7.87"), ("40", "4\\%"), ("30^\\circ", "60^\\circ"), ("3", "30 \\text{ hours}")]:  # fmt: skip
        rows.append(hand(gold, pred, False, "a different number, whatever its unit"))
    return rows


def factorials() -> list[dict]:
    same = [("120", "5!"), ("720", "6!"), ("24", "4!"), ("5040", "7!"), ("6", "3!"), ("40320", "8!"), ("1", "0!"), ("3628800", "10!"),
            ("20", "\\frac{5!}{3!}"), ("10", "\\binom{5}{2}"), ("15", "\\binom{6}{2}"), ("35", "\\binom{7}{3}"), ("5!", "120"), ("2", "2!"), ("36", "(3!)^2"), ("90", "\\frac{10!}{8!}")]  # fmt: skip
    differ = [
        ("120", "4!"),
        ("24", "5!"),
        ("720", "7!"),
        ("10", "\\binom{6}{3}"),
        ("6", "4!"),
        ("5040", "6!"),
        ("60", "5!"),
    ]
    return [sym(g, p, True, _factorial(g), _factorial(p)) for g, p in same] + [
        sym(g, p, False, _factorial(g), _factorial(p)) for g, p in differ
    ]


def _factorial(text: str) -> str:
    """sympy's spelling of `n!`, `\\binom{n}{k}` and their quotients and powers."""
    text = re.sub(r"\\binom\{(\d+)\}\{(\d+)\}", r"binomial(\1,\2)", text)
    text = re.sub(r"\\frac\{(.+?)\}\{(.+?)\}", r"(\1)/(\2)", text)
    return re.sub(r"(\d+)!", r"factorial(\1)", text).replace("^", "**")


def equations() -> list[dict]:
    same = [("y=2x+3", "y=3+2x", "Eq(y,2*x+3)", "Eq(y,3+2*x)"), ("x=5", "5", "5", "5"), ("5", "x=5", "5", "5"), ("k=1", "1", "1", "1"),
            ("y=-2x", "-2x=y", "Eq(y,-2*x)", "Eq(-2*x,y)"), ("x+y=5", "y+x=5", "Eq(x+y,5)", "Eq(y+x,5)"), ("y=x^2+1", "y=1+x^2", "Eq(y,x**2+1)", "Eq(y,1+x**2)"),
            ("\\frac{3}{4}", "p=\\frac{3}{4}", "Rational(3,4)", "Rational(3,4)"), ("y=-\\frac{1}{2}x+3", "y=3-\\frac{x}{2}", "Eq(y,-x/2+3)", "Eq(y,3-x/2)"),
            ("x^2+y^2=25", "y^2+x^2=25", "Eq(x**2+y**2,25)", "Eq(y**2+x**2,25)"), ("n=12", "12", "12", "12"), ("y=2x-4", "y=2(x-2)", "Eq(y,2*x-4)", "Eq(y,2*(x-2))"),
            ("a=-3", "-3", "-3", "-3"), ("f(x)=3x+1", "f(x)=1+3x", "Eq(y,3*x+1)", "Eq(y,1+3*x)"),
            ("2x=10", "x=5", "Eq(2*x,10)", "Eq(x,5)"), ("x+y=1", "2x+2y=2", "Eq(x+y,1)", "Eq(2*x+2*y,2)")]  # fmt: skip
    differ = [("y=2x+3", "y=2x-3", "Eq(y,2*x+3)", "Eq(y,2*x-3)"), ("y=2x+3", "y=3x+2", "Eq(y,2*x+3)", "Eq(y,3*x+2)"), ("x=5", "x=6", "5", "6"),
              ("y=-2x", "y=2x", "Eq(y,-2*x)", "Eq(y,2*x)"), ("x+y=5", "x-y=5", "Eq(x+y,5)", "Eq(x-y,5)"), ("k=1", "k=-1", "1", "-1"),
              ("y=x^2+1", "y=x^2-1", "Eq(y,x**2+1)", "Eq(y,x**2-1)"),
              ("2x=10", "x=10", "Eq(2*x,10)", "Eq(x,10)")]  # fmt: skip
    return [sym(g, p, True, sg, sp) for g, p, sg, sp in same] + [sym(g, p, False, sg, sp) for g, p, sg, sp in differ]


def sets_and_intervals() -> list[dict]:
    same = [("(2,\\infty)", "\\{x \\mid x>2\\}", "Interval.open(2,oo)", "Interval.open(2,oo)"), ("(2,\\infty)", "x>2", "Interval.open(2,oo)", "Interval.open(2,oo)"),
            ("[1,3]", "1 \\le x \\le 3", "Interval(1,3)", "Interval(1,3)"), ("(-\\infty, 0]", "x \\le 0", "Interval(-oo,0)", "Interval(-oo,0)"),
            ("(-\\infty,0]", "\\{x : x \\leq 0\\}", "Interval(-oo,0)", "Interval(-oo,0)"), ("[1,3]", "\\{x \\mid 1 \\le x \\le 3\\}", "Interval(1,3)", "Interval(1,3)"),
            ("(2,\\infty)", "x \\in (2, \\infty)", "Interval.open(2,oo)", "Interval.open(2,oo)"), ("(-1, 1)", "-1 < x < 1", "Interval.open(-1,1)", "Interval.open(-1,1)"),
            ("[0,\\infty)", "\\{x\\in\\mathbb{R} \\mid x \\ge 0\\}", "Interval(0,oo)", "Interval(0,oo)"),
            ("(-\\infty,-2)\\cup(2,\\infty)", "x<-2 \\text{ or } x>2", "Union(Interval.open(-oo,-2),Interval.open(2,oo))", "Union(Interval.open(-oo,-2),Interval.open(2,oo))"),
            ("[-2,7]", "\\{x \\mid -2 \\leq x \\leq 7\\}", "Interval(-2,7)", "Interval(-2,7)"), ("(-\\infty, 3)", "x<3", "Interval.open(-oo,3)", "Interval.open(-oo,3)"),
            ("[5,\\infty)", "x \\geq 5", "Interval(5,oo)", "Interval(5,oo)"), ("(0,1)", "0<x<1", "Interval.open(0,1)", "Interval.open(0,1)"),
            ("(-\\infty,-1]\\cup[1,\\infty)", "x \\le -1 \\text{ or } x \\ge 1", "Union(Interval(-oo,-1),Interval(1,oo))", "Union(Interval(-oo,-1),Interval(1,oo))"),
            ("x \\in [1, 3]", "[1,3]", "Interval(1,3)", "Interval(1,3)"), ("[-3,2]", "\\left\\{ x \\mid -3 \\le x \\le 2 \\right\\}", "Interval(-3,2)", "Interval(-3,2)"),
            ("(2, \\infty)", "\\{x\\,|\\,x>2\\}", "Interval.open(2,oo)", "Interval.open(2,oo)"),
            ("(-\\infty, 2) \\cup (2, \\infty)", "\\{x \\mid x \\neq 2\\}", "Union(Interval.open(-oo,2),Interval.open(2,oo))", "Union(Interval.open(-oo,2),Interval.open(2,oo))")]  # fmt: skip
    differ = [("(2,\\infty)", "[2,\\infty)", "Interval.open(2,oo)", "Interval(2,oo)"), ("(2,\\infty)", "x \\ge 2", "Interval.open(2,oo)", "Interval(2,oo)"),
              ("[1,3]", "1<x<3", "Interval(1,3)", "Interval.open(1,3)"), ("(-\\infty,0]", "x<0", "Interval(-oo,0)", "Interval.open(-oo,0)"),
              ("(2,\\infty)", "\\{x \\mid x<2\\}", "Interval.open(2,oo)", "Interval.open(-oo,2)"), ("[-2,7]", "\\{x \\mid -2 < x \\leq 7\\}", "Interval(-2,7)", "Interval.Lopen(-2,7)"),
              ("(-\\infty,-2)\\cup(2,\\infty)", "x<-2", "Union(Interval.open(-oo,-2),Interval.open(2,oo))", "Interval.open(-oo,-2)"),
              ("(0,1)", "0 \\le x \\le 1", "Interval.open(0,1)", "Interval(0,1)")]  # fmt: skip
    return [sym(g, p, True, sg, sp) for g, p, sg, sp in same] + [sym(g, p, False, sg, sp) for g, p, sg, sp in differ]


def hedges() -> list[dict]:
    rows = []
    lists = [("25", "26, 25"), ("25", "25, 26"), ("25", "25 \\text{ or } 26"), ("25", "x=25 \\text{ or } x=26"), ("25", "\\pm 25"),
             ("25", "25 \\pm 1"), ("25", "\\{25, 26\\}"), ("25", "25 \\text{ and } 26"), ("25", "25 \\text{ (or 26)}"),
             ("25", "\\text{either } 25 \\text{ or } 26"), ("25", "26 \\lor 25"), ("25", "26 \\vee 25"), ("25", "25; 26"),
             ("\\frac{1}{3}", "\\frac{1}{3} \\text{ or } \\frac{1}{2}"), ("5", "-5, 5"), ("-5", "5, -5"), ("12", "12, 13, 14"),
             ("7", "7 \\text{ or } 8"), ("1, 2", "1, 2, 3"), ("-2, 1", "-2, 1, 0"), ("3", "\\{1, 2, 3\\}"), ("3", "x = 3, y = 4"),
             ("100", "99 \\text{ or } 100"), ("0", "0, 1"), ("2", "2 \\text{ or } -2"), ("\\sqrt{2}", "\\pm\\sqrt{2}"),
             ("8", "8 \\quad \\text{or} \\quad 9"), ("4", "4, 4.5"), ("1, 2", "1 \\text{ or } 2 \\text{ or } 3"), ("10", "10 \\mp 1")]  # fmt: skip
    for gold, pred in lists:
        rows.append(hand(gold, pred, False, "a list of candidates against a reference with fewer values"))
    for gold, pred in [("25", "24 \\le x \\le 26"), ("25", "x \\ge 25"), ("25", "x > 24"), ("25", "[25, 26]"), ("25", "(24, 26)"),
                       ("5", "5 \\le x"), ("3", "x < 4"), ("10", "9 < x < 11"), ("25", "25 \\text{ to } 26"), ("25", "25\\text{--}26")]:  # fmt: skip
        rows.append(hand(gold, pred, False, "a range or an inequality, not a value"))
    for gold, pred in [
        ("5", "x"),
        ("5", "n"),
        ("7", "a+b"),
        ("7", "2k+1"),
        ("12", "n^2-4"),
        ("3", "\\frac{a}{b}"),
        ("1", "x=y"),
    ]:
        rows.append(hand(gold, pred, False, "a variable or expression in variables where a value is asked"))
    close = [("\\frac{1}{3}", "0.333", "Rational(1,3)", "Rational(333,1000)"), ("\\frac{1}{3}", "0.3333333", "Rational(1,3)", "Rational(3333333,10000000)"),
             ("\\sqrt{2}", "1.414", "sqrt(2)", "Rational(1414,1000)"), ("\\pi", "3.14", "pi", "Rational(314,100)"), ("\\pi", "3.1416", "pi", "Rational(31416,10000)"),
             ("25", "25.0000001", "25", "Rational(250000001,10000000)"), ("25", "24.99999999", "25", "Rational(2499999999,100000000)"),
             ("e", "2.718", "E", "Rational(2718,1000)"), ("\\frac{2}{3}", "0.6667", "Rational(2,3)", "Rational(6667,10000)"),
             ("\\frac{1}{7}", "0.142857", "Rational(1,7)", "Rational(142857,1000000)"), ("\\sqrt{3}", "1.7320508", "sqrt(3)", "Rational(17320508,10000000)"),
             ("0.5", "0.5000001", "Rational(1,2)", "Rational(5000001,10000000)"), ("\\frac{1}{12}", "0.0833333333", "Rational(1,12)", "Rational(833333333,10**10)"),
             ("100", "99.9999999", "100", "Rational(999999999,10**7)"), ("0.33", "0.333", "Rational(33,100)", "Rational(333,1000)")]  # fmt: skip
    rows += [sym(g, p, False, sg, sp) for g, p, sg, sp in close]
    return rows


def plain_numbers() -> list[dict]:
    same = [("7425000", "7,425,000"), ("1000", "1,000"), ("58500", "58,500"), ("10080", "10,\\!080"), ("10,\\!080", "10080"), ("58,500", "58500"),
            ("1000", "1 000"), ("1000.99", "1000,99"), ("0.111", "0,111"), ("0.4", ".4"), (".0000672", "0.0000672"), ("3.21", "3.210"),
            ("1000", "1000.0"), ("1\\frac{4}{5}", "\\frac{9}{5}"), ("137 \\frac{1}{2}", "137.5"), ("1\\frac{4}{5}", "1.8"), ("2.5", "\\frac{5}{2}"),
            ("0.5", "\\frac12"), ("1020108", "1,020,108"), ("1000000", "10^6"), ("12.5", "\\frac{25}{2}"), ("0.25", "\\frac{1}{4}"),
            ("2\\frac{1}{3}", "\\frac{7}{3}"), ("-1\\frac{1}{2}", "-\\frac{3}{2}"), ("3.5", "3\\frac{1}{2}"), ("1{,}000", "1000"), ("1\\,000", "1000"),
            ("6.72\\times 10^{-5}", "0.0000672")]  # fmt: skip
    to_sympy = {"7425000": "7425000", "1000": "1000", "58500": "58500", "10080": "10080"}
    rows = []
    for gold, pred in same:
        rows.append(
            hand(
                gold,
                pred,
                True,
                "the same number: thousands separators, a decimal comma, a mixed number, trailing zeros",
            )
        )
    for gold, pred in [("1000", "100"), ("7425000", "7,425"), ("1.8", "1\\frac{4}{6}"), ("1000.99", "1000,9"), ("58500", "5,850"),
                       ("0.4", ".04"), ("137\\frac{1}{2}", "137.2"), ("2.5", "\\frac{2}{5}"), ("1000", "1,000,000"), ("3.21", "3.12")]:  # fmt: skip
        rows.append(hand(gold, pred, False, "a different number"))
    del to_sympy
    return rows


def math500_forms(rng: random.Random) -> list[dict]:
    """MATH-500 reference answers: each with itself, an equal rewrite and a wrong answer (hand-written)."""
    rows = [hand(g, p, True, why) for g, p, why in [
        ("\\frac{\\sqrt{3}}{3}", "\\frac{1}{\\sqrt{3}}", "rationalised denominator"), ("\\cot x", "\\frac{\\cos x}{\\sin x}", "definition of cot"),
        ("3\\sqrt{13}", "\\sqrt{117}", "9*13 = 117"), ("\\text{(B)}", "B", "the same choice"), ("\\text{(E)}", "\\text{E}", "the same choice"),
        ("12\\pi", "12 \\pi", "spacing"), ("(6,31,-1)", "(6, 31, -1)", "spacing"), ("\\left( 3, \\frac{\\pi}{2} \\right)", "(3, \\frac{\\pi}{2})", "\\left/\\right"),
        ("\\begin{pmatrix} 1/5 \\\\ -18/5 \\end{pmatrix}", "\\begin{pmatrix} \\frac15 \\\\ -\\frac{18}{5} \\end{pmatrix}", "fractions written two ways"),
        ("\\text{Navin}", "Navin", "the same name"), ("-\\frac{24}{25}", "-0.96", "24/25 = 0.96 exactly"), ("\\frac{243}{625}", "0.3888", "243/625 = 0.3888 exactly"),
        ("\\frac{11}{2}", "5.5", "11/2 = 5.5"), ("288 \\pi", "288\\pi", "spacing"), ("16 \\sqrt{3}", "\\sqrt{768}", "256*3 = 768"),
        ("\\frac{20000}{\\pi}", "20000/\\pi", "slash"), ("6\\sqrt{2}", "\\sqrt{72}", "36*2 = 72"), ("\\frac14", "\\frac{1}{4}", "braces"),
        ("1 - 12i", "1-12i", "spacing"), ("\\left[ \\frac{\\pi^2}{8}, \\frac{5 \\pi^2}{4} \\right]", "[\\frac{\\pi^2}{8}, \\frac{5\\pi^2}{4}]", "\\left/\\right"),
        ("y = -2x", "y=-2x", "spacing"), ("(-\\infty, 0]", "(-\\infty,0]", "spacing"), ("3R^2", "3R^{2}", "braces"), ("-\\frac{\\pi}{6}", "-\\pi/6", "slash"),
        ("x^3+3x-6", "x^{3}+3x-6", "braces"), ("\\frac{2}{1005}", "\\dfrac{2}{1005}", "\\dfrac"), ("4343_6", "4343_{6}", "braces"),
        ("864 \\mbox{ inches}^2", "864", "unit dropped"), ("5.4 \\text{ cents}", "5.4", "unit dropped"), ("58,500", "58500", "thousands separator")]]  # fmt: skip
    rows += [hand(g, p, False, why) for g, p, why in [
        ("\\frac{11}{2}", "\\frac{2}{11}", "inverted"), ("(6,31,-1)", "(6,-1,31)", "an ordered triple reordered"), ("\\text{(B)}", "\\text{(C)}", "another choice"),
        ("4343_6", "4342_6", "another number"), ("3\\sqrt{13}", "13\\sqrt{3}", "another number"), ("\\cot x", "\\tan x", "another function"),
        ("12\\pi", "12", "pi dropped"), ("-\\frac{24}{25}", "\\frac{24}{25}", "sign"), ("\\frac{\\sqrt{3}}{3}", "\\sqrt{3}", "another number"),
        ("\\text{Navin}", "\\text{Sarah}", "another name"), ("(-\\infty, 0]", "(-\\infty, 0)", "endpoint"), ("y = -2x", "y = 2x", "sign"),
        ("1+2i", "2+i", "parts swapped"), ("\\begin{pmatrix} -2 \\\\ -14 \\\\ -7 \\end{pmatrix}", "\\begin{pmatrix} -2 \\\\ -7 \\\\ -14 \\end{pmatrix}", "entries reordered"),
        ("x^3+3x-6", "x^3-3x+6", "signs"), ("326.5", "326", "rounded"), ("3.21", "3.2", "rounded"), ("\\frac{35}{64}", "\\frac{35}{46}", "another number")]]  # fmt: skip
    source = HERE.parents[2] / "shared" / "data" / "math500.jsonl"
    if source.exists():  # the references as they are, each against itself (identity must always hold)
        answers = sorted({json.loads(line)["answer"] for line in source.read_text().splitlines()})
        for answer in rng.sample(answers, 30):
            rows.append(hand(answer, answer, True, "identical strings"))
    return rows


def aime_and_dapo(rng: random.Random) -> list[dict]:
    rows = [hand(g, p, True, "zero padding or a thousands separator") for g, p in [
        ("025", "25"), ("073", "73"), ("080", "80"), ("045", "45"), ("023", "23"), ("204", "204"), ("1020108", "1,020,108"),
        ("1996906", "1996906"), ("-54", "-54"), ("19683", "3^9"), ("1764", "42^2"), ("2016", "2016"), ("3997", "3997.0"), ("7350", "7,350")]]  # fmt: skip
    rows += [hand(g, p, False, "another integer") for g, p in [
        ("025", "52"), ("073", "37"), ("204", "205"), ("023", "32"), ("-54", "54"), ("1020108", "1020180"), ("19683", "3^8"),
        ("1764", "41^2"), ("2016", "2015"), ("080", "8"), ("7350", "735")]]  # fmt: skip
    source = HERE.parents[2] / "shared" / "data" / "dapo_sample.jsonl"
    if source.exists():
        answers = sorted({json.loads(line)["answer"] for line in source.read_text().splitlines()})
        for answer in rng.sample(answers, 20):
            rows.append(hand(answer, answer, True, "identical strings"))
            if answer.lstrip("-").isdigit():
                rows.append(hand(answer, str(int(answer) + 1), False, "another integer"))
    return rows


def set_operations() -> list[dict]:
    """Unions, intersections and differences of intervals and finite sets, evaluated before comparison."""
    same = [("[1,3]", "[1,2] \\cup [2,3]", "Interval(1,3)", "Union(Interval(1,2),Interval(2,3))"),
            ("[0,2]", "[0, 1) \\cup [1, 2]", "Interval(0,2)", "Union(Interval.Ropen(0,1),Interval(1,2))"),
            ("[1,2] \\cup [2,3]", "[1,3]", "Union(Interval(1,2),Interval(2,3))", "Interval(1,3)"),
            ("[3,5]", "[1,5] \\cap [3,7]", "Interval(3,5)", "Intersection(Interval(1,5),Interval(3,7))"),
            ("\\{2,3\\}", "\\{1,2,3\\} \\cap \\{2,3,4\\}", "FiniteSet(2,3)", "Intersection(FiniteSet(1,2,3),FiniteSet(2,3,4))"),
            ("\\{1,2,3\\}", "\\{1,2\\} \\cup \\{3\\}", "FiniteSet(1,2,3)", "Union(FiniteSet(1,2),FiniteSet(3))"),
            ("\\{1,2\\}", "\\{1,2,3\\} \\setminus \\{3\\}", "FiniteSet(1,2)", "Complement(FiniteSet(1,2,3),FiniteSet(3))"),
            ("[0,1) \\cup (1,2]", "[0,2] \\setminus \\{1\\}", "Union(Interval.Ropen(0,1),Interval.Lopen(1,2))", "Complement(Interval(0,2),FiniteSet(1))"),
            ("(-\\infty,2)\\cup(2,\\infty)", "\\mathbb{R} \\setminus \\{2\\}", "Union(Interval.open(-oo,2),Interval.open(2,oo))", "Complement(Reals,FiniteSet(2))"),
            ("\\mathbb{R} \\setminus (1, 3)", "(-\\infty, 1] \\cup [3, \\infty)", "Complement(Reals,Interval.open(1,3))", "Union(Interval(-oo,1),Interval(3,oo))"),
            ("(-\\infty,2) \\cup (3,\\infty)", "(-\\infty,2) U (3,\\infty)", "Union(Interval.open(-oo,2),Interval.open(3,oo))", "Union(Interval.open(-oo,2),Interval.open(3,oo))"),
            ("[-1,4]", "[-1,2] \\cup [0,4]", "Interval(-1,4)", "Union(Interval(-1,2),Interval(0,4))")]  # fmt: skip
    differ = [("[1,3]", "[1,2] \\cup [2,4]", "Interval(1,3)", "Union(Interval(1,2),Interval(2,4))"),
              ("[0,2]", "[0,1) \\cup (1,2]", "Interval(0,2)", "Union(Interval.Ropen(0,1),Interval.Lopen(1,2))"),
              ("[3,5]", "[1,5] \\cap [4,7]", "Interval(3,5)", "Intersection(Interval(1,5),Interval(4,7))"),
              ("\\{1\\}", "\\{1,2\\} \\cap \\{2,3\\}", "FiniteSet(1)", "Intersection(FiniteSet(1,2),FiniteSet(2,3))"),
              ("\\{1,2,3\\}", "\\{1,2\\} \\cup \\{4\\}", "FiniteSet(1,2,3)", "Union(FiniteSet(1,2),FiniteSet(4))"),
              ("(-\\infty,2)\\cup(2,\\infty)", "\\mathbb{R} \\setminus \\{3\\}", "Union(Interval.open(-oo,2),Interval.open(2,oo))", "Complement(Reals,FiniteSet(3))")]  # fmt: skip
    return [sym(g, p, True, sg, sp) for g, p, sg, sp in same] + [sym(g, p, False, sg, sp) for g, p, sg, sp in differ]


def component_arithmetic() -> list[dict]:
    """Arithmetic inside a tuple's, interval's, set's or matrix's components."""
    same = [("(4, 6)", "(2 \\cdot 2, 6)", "Tuple(4,6)", "Tuple(2*2,6)"), ("(2,3)", "(\\frac{4}{2}, 3)", "Tuple(2,3)", "Tuple(Rational(4,2),3)"),
            ("(2,4)", "(1+1, 2^2)", "Tuple(2,4)", "Tuple(1+1,2**2)"), ("(2,3)", "(\\sqrt{4}, 3)", "Tuple(2,3)", "Tuple(sqrt(4),3)"),
            ("(2,2,2)", "(1+1, 3-1, 2)", "Tuple(2,2,2)", "Tuple(1+1,3-1,2)"), ("[1,3]", "[\\frac{2}{2}, 3]", "Interval(1,3)", "Interval(Rational(2,2),3)"),
            ("\\{4, 6\\}", "\\{2+2, 6\\}", "FiniteSet(4,6)", "FiniteSet(2+2,6)"),
            ("\\begin{pmatrix} 4 \\\\ 6 \\end{pmatrix}", "\\begin{pmatrix} 2 \\cdot 2 \\\\ 3+3 \\end{pmatrix}", "Matrix([4,6])", "Matrix([2*2,3+3])"),
            ("\\begin{pmatrix} 1 & 2 \\\\ 3 & 4 \\end{pmatrix}", "\\begin{pmatrix} \\frac{2}{2} & 1+1 \\\\ 3 & 2^2 \\end{pmatrix}", "Matrix([[1,2],[3,4]])", "Matrix([[Rational(2,2),1+1],[3,2**2]])"),
            ("(6, 31, -1)", "(2 \\cdot 3, 30+1, -1)", "Tuple(6,31,-1)", "Tuple(2*3,30+1,-1)")]  # fmt: skip
    differ = [("(4, 6)", "(2 \\cdot 3, 6)", "Tuple(4,6)", "Tuple(2*3,6)"), ("(2,2,2)", "(1+1, 3-1, 3)", "Tuple(2,2,2)", "Tuple(1+1,3-1,3)"),
              ("(2,4)", "(2^2, 1+1)", "Tuple(2,4)", "Tuple(2**2,1+1)"), ("\\{4, 6\\}", "\\{2+3, 6\\}", "FiniteSet(4,6)", "FiniteSet(2+3,6)"),
              ("\\begin{pmatrix} 4 \\\\ 6 \\end{pmatrix}", "\\begin{pmatrix} 2 \\cdot 3 \\\\ 2 \\cdot 2 \\end{pmatrix}", "Matrix([4,6])", "Matrix([2*3,2*2])")]  # fmt: skip
    return [sym(g, p, True, sg, sp) for g, p, sg, sp in same] + [sym(g, p, False, sg, sp) for g, p, sg, sp in differ]


def named_values() -> list[dict]:
    """`name = value` and `(x, y) = (...)` against the values alone (the sympy pair: the values)."""
    same = [("(x, y) = (1, -1)", "(1, -1)", "Tuple(1,-1)", "Tuple(1,-1)"), ("(1, -1)", "(x, y) = (1, -1)", "Tuple(1,-1)", "Tuple(1,-1)"),
            ("(1,2,3)", "(a,b,c) = (1,2,3)", "Tuple(1,2,3)", "Tuple(1,2,3)"), ("0.5", "x=\\frac{1}{2}", "Rational(1,2)", "Rational(1,2)"),
            ("x = 5", "5", "5", "5"), ("5", "k=5", "5", "5"), ("\\theta = \\frac{\\pi}{3}", "\\frac{\\pi}{3}", "pi/3", "pi/3"),
            ("(a, b) = (2, 3)", "\\left(2, 3\\right)", "Tuple(2,3)", "Tuple(2,3)"), ("x_1 = 4", "4", "4", "4")]  # fmt: skip
    differ = [("(x, y) = (1, -1)", "(-1, 1)", "Tuple(1,-1)", "Tuple(-1,1)"), ("(1,2,3)", "(a,b,c) = (1,3,2)", "Tuple(1,2,3)", "Tuple(1,3,2)"),
              ("x = 5", "6", "5", "6"), ("5", "k=-5", "5", "-5"), ("(a, b) = (2, 3)", "(3, 2)", "Tuple(2,3)", "Tuple(3,2)")]  # fmt: skip
    return [sym(g, p, True, sg, sp) for g, p, sg, sp in same] + [sym(g, p, False, sg, sp) for g, p, sg, sp in differ]


def _repeating(whole: int, fixed: str, period: str) -> str:
    """A repeating decimal as sympy sums it: whole + fixed digits + the period repeated for ever (a series)."""
    n, m = len(fixed), len(period)
    fixed_part = f"Rational({int(fixed or 0)}, 10**{n})"
    return f"{whole} + {fixed_part} + Sum({int(period)} * 10**(-{n} - {m}*k), (k, 1, oo))"


def repeating_decimals() -> list[dict]:
    """Overlined, dotted and bracketed periods are exact values (the label: sympy's sum of the series)."""
    same = [("\\frac{1}{3}", "0.\\overline{3}", "Rational(1,3)", _repeating(0, "", "3")),
            ("\\frac{1}{6}", "0.1\\overline{6}", "Rational(1,6)", _repeating(0, "1", "6")),
            ("\\frac{1}{11}", "0.\\overline{09}", "Rational(1,11)", _repeating(0, "", "09")),
            ("\\frac{22}{7}", "3.\\overline{142857}", "Rational(22,7)", _repeating(3, "", "142857")),
            ("1", "0.\\overline{9}", "1", _repeating(0, "", "9")), ("\\frac{41}{333}", "0.\\overline{123}", "Rational(41,333)", _repeating(0, "", "123")),
            ("\\frac{1}{3}", "0.(3)", "Rational(1,3)", _repeating(0, "", "3")), ("\\frac{2}{3}", "0.\\dot{6}", "Rational(2,3)", _repeating(0, "", "6")),
            ("\\frac{137}{110}", "1.2\\overline{45}", "Rational(137,110)", _repeating(1, "2", "45")),
            ("0.\\overline{3}", "\\frac{1}{3}", _repeating(0, "", "3"), "Rational(1,3)")]  # fmt: skip
    differ = [("\\frac{1}{3}", "0.\\overline{4}", "Rational(1,3)", _repeating(0, "", "4")),
              ("\\frac{1}{3}", "0.\\overline{34}", "Rational(1,3)", _repeating(0, "", "34")),
              ("\\frac{1}{6}", "0.\\overline{16}", "Rational(1,6)", _repeating(0, "", "16")),
              ("\\frac{22}{7}", "3.\\overline{14}", "Rational(22,7)", _repeating(3, "", "14")),
              ("\\frac{1}{3}", "0.3", "Rational(1,3)", "Rational(3,10)")]  # fmt: skip
    return [sym(g, p, True, sg, sp) for g, p, sg, sp in same] + [sym(g, p, False, sg, sp) for g, p, sg, sp in differ]


def mixed_in_percent_and_units() -> list[dict]:
    """Mixed numbers (and repeating decimals) inside a percentage, before a unit or a currency sign."""
    same = [("33\\frac{1}{3}\\%", "\\frac{100}{3}\\%", "33+Rational(1,3)", "Rational(100,3)"),
            ("12.5\\%", "12\\frac{1}{2}\\%", "Rational(25,2)", "12+Rational(1,2)"), ("2.5", "2\\frac{1}{2} \\text{ hours}", "Rational(5,2)", "2+Rational(1,2)"),
            ("\\frac{3}{2}", "1\\frac{1}{2}\\text{ cups}", "Rational(3,2)", "1+Rational(1,2)"), ("2.5", "\\$2\\frac{1}{2}", "Rational(5,2)", "2+Rational(1,2)"),
            ("\\frac{21}{4}", "5\\frac{1}{4} \\text{ inches}", "Rational(21,4)", "5+Rational(1,4)"),
            ("\\frac{10}{3}", "3 \\frac{1}{3}\\text{ m}^2", "Rational(10,3)", "3+Rational(1,3)"), ("2.5", "2\\tfrac{1}{2}%", "Rational(5,2)", "2+Rational(1,2)"),
            ("2.5", "2 1/2", "Rational(5,2)", "2+Rational(1,2)"), ("\\frac{7}{3}", "\\frac{7}{3}\\,\\text{cm}", "Rational(7,3)", "Rational(7,3)"),
            ("\\frac{100}{3}\\%", "33.\\overline{3}\\%", "Rational(100,3)", _repeating(33, "", "3"))]  # fmt: skip
    differ = [("12.5\\%", "12\\frac{1}{3}\\%", "Rational(25,2)", "12+Rational(1,3)"), ("33\\frac{1}{3}\\%", "\\frac{100}{6}\\%", "33+Rational(1,3)", "Rational(100,6)"),
              ("2.5", "2\\frac{1}{4} \\text{ hours}", "Rational(5,2)", "2+Rational(1,4)"), ("2.5", "3 1/2", "Rational(5,2)", "3+Rational(1,2)"),
              ("50\\%", "0.5", "50", "Rational(1,2)")]  # fmt: skip
    return [sym(g, p, True, sg, sp) for g, p, sg, sp in same] + [sym(g, p, False, sg, sp) for g, p, sg, sp in differ]


def main() -> None:
    rng = random.Random(0)
    categories = {"signed_integers": signed_integers(), "sums_and_polynomials": sums_and_polynomials(),
                  "complex_numbers": complex_numbers(), "lists_of_roots": lists_of_roots(), "units_and_currency": units_and_currency(),
                  "factorials": factorials(), "equations": equations(), "sets_and_intervals": sets_and_intervals(), "hedges": hedges(),
                  "plain_numbers": plain_numbers(), "math500_forms": math500_forms(rng), "aime_and_dapo": aime_and_dapo(rng),
                  "set_operations": set_operations(), "component_arithmetic": component_arithmetic(), "named_values": named_values(),
                  "repeating_decimals": repeating_decimals(), "mixed_in_percent_and_units": mixed_in_percent_and_units()}  # fmt: skip
    lines = []
    for category, rows in categories.items():
        for i, row in enumerate(rows):
            lines.append(json.dumps({"id": f"{category}-{i:03d}", "category": category, **row}, ensure_ascii=False))
    (HERE / "judge_cases.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(f"{len(lines)} pairs in {len(categories)} categories")


if __name__ == "__main__":
    main()
