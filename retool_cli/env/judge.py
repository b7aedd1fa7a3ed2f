"""The judge: is a final answer equal to the reference? Runs inside math-verify worker processes (reward.Verifier).

    answer (a box's content) --read_answer: plain-text forms settled explicitly--> LaTeX
      --hedged? (a list of candidates against one value) --> not equal
      --math-verify reading $...$ (sympy)--> i as the imaginary unit, inequalities as sets
      --verify, then decimals settled exactly (0.333 is not 1/3)--> verdict

A box's content is read as math: math-verify's plain-text reading takes `2x+3` for the number 3 and `26, 25` for
25. The forms plain text needs (thousands separators, a decimal comma against a decimal, mixed numbers, unit and
percent words, empty-set spellings, set-builder notation) are rewritten first, each by one rule below. A whole
response (anything with math delimiters or a `\\boxed`) is left to math-verify's own extraction, as before.
"""

from __future__ import annotations

import functools
import json
import re
import sys
from typing import Any

# ------------------------------------------------------------------ reading a box's content

_TEXT_MARKERS = re.compile(r"(?<!\\)\$|\\\(|\\\[|\\boxed|\\fbox")
_WORD = re.compile(r"(?<![\\A-Za-z])[A-Za-z]{2,}")
_LATEX_TEXT = re.compile(r"\\(?:text|textbf|mathrm|mbox|operatorname)\{[^{}]*\}")
_UNICODE = {"\u2212": "-", "\u2013": "-", "\u00d7": "\\times ", "\u00f7": "\\div ", "\u2264": "\\le ",
            "\u2265": "\\ge ", "\u2260": "\\neq ", "\u221e": "\\infty ", "\u03c0": "\\pi ", "\u221a": "\\sqrt",
            "\u00b2": "^2", "\u00b3": "^3", "\u00b0": "^\\circ", "\u2205": "\\emptyset "}  # fmt: skip
_EMPTY_SET = re.compile(
    r"^(?:\\varnothing|\\emptyset|\\\{\s*\\\}|(?:\\text\{)?\s*(?:no\s+(?:real\s+)?solutions?|none|empty\s+set)\s*\}?)$",
    re.IGNORECASE,
)
_SET_BUILDER = re.compile(r"^\\\{\s*([A-Za-z])\s*(?:\\in\s*\\mathbb\{?R\}?\s*)?(?:\\mid|\||:)\s*(.+?)\s*\\\}$")
# a number with comma thousands separators (1,000 and 7,425,000; not 0,111 nor 26,25); reward.py uses it too
THOUSANDS = re.compile(r"^-?[1-9]\d{0,2}(?:,\d{3})+(?:\.\d+)?$")
_SPACED_THOUSANDS = re.compile(r"^-?[1-9]\d{0,2}(?:(?:\\,|\\ |~| )\d{3})+(?:\.\d+)?$")
# LaTeX's `{,}` between a digit and exactly three more is a thousands separator (a decimal comma has other counts)
_BRACED_THOUSANDS = re.compile(r"(?<=\d)\{,\}(?=\d{3}(?!\d))")
_PLUS_MINUS = re.compile(r"\\pm(?![a-z])|\\mp(?![a-z])")
_DECIMAL_COMMA = re.compile(r"^-?\d+,\d+$")
_DECIMAL = re.compile(r"^-?\d*\.\d+$")
_MIXED_NUMBER = re.compile(r"^(-?)(\d+)\s*\\[dt]?frac\{(\d+)\}\{(\d+)\}$")
_PERCENT_WORD = re.compile(r"(\d)\s*(?:percent(?:age)?|pct)\b\.?", re.IGNORECASE)
_PERCENT_SIGN = re.compile(r"(?<=[\d})])\s*\\?%$")  # math-verify reads 50\% as 50: the sign is a unit
# 0.\overline{3}, 1.2\overline{45}, 0.\dot{6}: a repeating decimal is the fraction it spells
_REPEATING = re.compile(r"(\d*)\.(\d*)(?:\\(?:overline|bar|dot)\s*\{?(\d+)\}?|\((\d+)\)$)")
_PLAIN_MIXED_NUMBER = re.compile(r"^(-?)(\d+)\s+(\d+)\s*/\s*(\d+)$")  # 2 1/2 in plain text
_LETTER_UNION = re.compile(r"([)\]}])\s*U\s*(?=[(\[]|\\\{)")  # (-\infty, 2) U (3, \infty)
# `x = 5`, `\theta_1 = \frac{\pi}{3}`, `(x, y) = (1, -1)`: a name (or a tuple of names) given its value
_NAME = r"(?:\\[A-Za-z]+|[A-Za-z])(?:_\{?\w+\}?)?"
_NAMED_VALUE = re.compile(rf"^(?:{_NAME}|(?:\\left)?\(\s*{_NAME}(?:\s*,\s*{_NAME})+\s*(?:\\right)?\))\s*=\s*([^=]+)$")
_CURRENCY = re.compile(r"^(?:\\\$|US\$|USD|[€£¥])\s*|\s*(?:\\\$|[€£¥]|USD|dollars?|cents?|euros?|yuan)\.?$")
_BARE_WORD = re.compile(r"^[A-Za-z]{2,}$")
_UNIT = re.compile(
    r"(\d|\})\s*\\(?:text|textnormal|mbox|mathrm)\{\s*(?!(?:or|and)\s*\})[A-Za-z][A-Za-z ./]*\}(?:\s*\^\s*\{?[23]\}?)?"
)
_TRIG = re.compile(r"\\(?:sin|cos|tan|cot|sec|csc)(?![a-z])")
_DEGREES = re.compile(r"(\d+(?:\.\d+)?)\s*\^\s*\{?\\circ\}?")


def is_text(answer: str) -> bool:
    """A whole response or a sentence, rather than the content of a box."""
    if _TEXT_MARKERS.search(answer):
        return True
    return len(_WORD.findall(_LATEX_TEXT.sub(" ", answer))) >= 4  # a sentence, not an answer


def read_answer(answer: str, other: str) -> str:
    """LaTeX for a box's content, with the forms plain text needs settled: `other` (the answer it is compared
    with) decides the two ambiguous commas, as a reader would: `1,000` is a thousand against a number, `1,5`
    is one and a half only against a decimal."""
    text = answer.strip()
    for char, latex in _UNICODE.items():
        text = text.replace(char, latex)
    text = _BRACED_THOUSANDS.sub("", text)  # (1{,}000, 2{,}500): separators inside numbers, not between them
    text = text.replace(",\\!", ",").replace("{,}", ",").strip()
    if text.endswith(".") and not text.endswith("\\."):  # a sentence's full stop
        text = text[:-1].rstrip()
    if _EMPTY_SET.match(text):
        return "\\emptyset"
    if "=" not in other and (named := _NAMED_VALUE.match(text)):
        text = named.group(1).strip()  # against a bare value, `x = 5` gives 5 and `(x, y) = (1, 2)` gives (1, 2)
    spaced = re.sub(r"\\[,;:! ]", " ", text).replace("\\left\\{", "\\{").replace("\\right\\}", "\\}")
    if match := _SET_BUILDER.match(spaced):
        return match.group(2)  # {x | x > 2} is read as x > 2, which is compared with sets as a set
    if len(_PLUS_MINUS.findall(text)) == 1:  # \frac{-3 \pm \sqrt{5}}{2}: the two values it stands for
        plus, minus = _PLUS_MINUS.sub("+", text), _PLUS_MINUS.sub("-", text)
        text = f"{plus}, {minus}" if not text.startswith(("\\{", "(", "[")) else text
    if _TRIG.search(text):  # sin 60^\\circ is read in degrees (math-verify drops the mark: sin of 60 radians)
        text = _DEGREES.sub(r"(\\frac{\1\\pi}{180})", text)
    text = _PERCENT_WORD.sub(r"\1\\%", text)
    text = _UNIT.sub(r"\1", text)  # 864 \\mbox{ inches}^2, also inside brackets where math-verify keeps units
    text = _CURRENCY.sub("", text).strip()
    text = _PERCENT_SIGN.sub("", text)  # 33\\frac{1}{3}\\%: the mixed number below is then read
    text = _REPEATING.sub(_repeating_as_fraction, text)
    text = _LETTER_UNION.sub(r"\1 \\cup ", text)
    if (plain := _PLAIN_MIXED_NUMBER.match(text)) and int(plain.group(3)) < int(plain.group(4)):
        text = "{}{}\\frac{{{}}}{{{}}}".format(*plain.groups())  # read as a mixed number below
    other_is_list = candidate_count(other) > 1
    if THOUSANDS.match(text) and not other_is_list:
        return text.replace(",", "")
    if _SPACED_THOUSANDS.match(text):
        return re.sub(r"\\,|\\ |~| ", "", text)
    if _DECIMAL_COMMA.match(text) and _DECIMAL.match(other.strip()):
        return text.replace(",", ".")  # 1000,99 against 1000.99: a decimal comma
    if match := _MIXED_NUMBER.match(text):
        sign, whole, num, den = match.groups()
        if int(num) < int(den):  # 1\frac{4}{5} is one and four fifths
            return f"{sign}({whole}+\\frac{{{num}}}{{{den}}})"
    if _BARE_WORD.match(text):
        return f"\\text{{{text}}}"  # a name ("Navin"), not a product of symbols
    return text


def _repeating_as_fraction(match: re.Match[str]) -> str:
    """`1.2\\overline{45}` -> the exact fraction: whole + fixed digits / 10^n + period / ((10^m - 1) 10^n)."""
    from fractions import Fraction

    whole, fixed, period = match.group(1) or "0", match.group(2), match.group(3) or match.group(4)
    value = int(whole) + Fraction(int(fixed or "0"), 10 ** len(fixed))
    value += Fraction(int(period), (10 ** len(period) - 1) * 10 ** len(fixed))
    return f"\\frac{{{value.numerator}}}{{{value.denominator}}}" if value.denominator != 1 else str(value.numerator)


# ------------------------------------------------------------------ hedges

_ALTERNATIVE = re.compile(r"(?<![\\A-Za-z])(?:or|and)(?![A-Za-z])|\\lor|\\vee|\\text\{\s*(?:or|and)\s*\}")
_OPEN, _CLOSE = "([{", ")]}"


def candidate_count(answer: str) -> int:
    """How many values an answer gives: parts of a top-level list (`,` `;` `or` `and`) or of the one set
    or tuple it is, and two for each `\\pm`. An `or` anywhere (`25 (or 26)`) is one more candidate."""
    text = re.sub(r"\\left|\\right|\\[,;! ]|\\quad|\\qquad", " ", answer)
    text = text.replace("\\{", "{").replace("\\}", "}").strip()
    nested_alternatives = 0
    if len(text) > 1 and text[0] in "({" and _matching_close(text, 0) == len(text) - 1:
        text = text[1:-1]  # the whole answer is one set or tuple: count its elements ([a, b] is one interval)
    parts: list[str] = []
    depth = 0
    current: list[str] = []
    marked = _ALTERNATIVE.sub("\0", text)
    for char in marked:
        depth += (char in _OPEN) - (char in _CLOSE)
        if depth == 0 and char in ",;\0":
            parts.append("".join(current))
            current = []
        else:
            nested_alternatives += char == "\0"
            current.append(char)
    parts.append("".join(current))
    values = [part for part in parts if part.strip()]
    plus_minus = sum(part.count("\\pm") + part.count("\\mp") for part in values)
    return len(values) + plus_minus + nested_alternatives


def _matching_close(text: str, start: int) -> int:
    depth = 0
    for i in range(start, len(text)):
        depth += (text[i] in _OPEN) - (text[i] in _CLOSE)
        if depth == 0:
            return i
    return -1


def hedged(gold: str, pred: str) -> bool:
    """A list of candidates never earns the reward unless the reference is a list of that many values."""
    count = candidate_count(pred)
    return count > 1 and count != candidate_count(gold)


# ------------------------------------------------------------------ comparing the parsed answers


def _as_math(text: str) -> str:
    """math-verify reads bare LaTeX ("\\frac12", "(1,2]", "1.5\\times10^{3}") only inside math delimiters;
    plain text ("1000,99", "7,425,000") it reads better as it is."""
    if any(d in text for d in ("$", "\\(", "\\[", "\\boxed")) or not any(c in text for c in "\\{}[]()^_"):
        return text
    return f"${text}$"


def _with_imaginary_unit(parsed: list[Any]) -> list[Any]:
    """In a math answer `i` is the imaginary unit: `2e^{i\\pi/3}` equals `1+\\sqrt{3}i` only then."""
    import sympy

    def substituted(x: Any) -> Any:
        if not isinstance(x, sympy.Basic):
            return x
        return x.xreplace({s: sympy.I for s in x.free_symbols if getattr(s, "name", "") == "i"})

    return [substituted(x) for x in parsed]


def _evaluated(expr: Any) -> Any:
    """Set operations and the arithmetic inside a tuple's, set's, interval's or matrix's components carried out
    (math-verify keeps `[1,2] \\cup [2,3]` and `(2 \\cdot 2, 6)` unevaluated): `[1,3]` and `(4, 6)`."""
    import sympy

    if isinstance(expr, (sympy.Set, sympy.Tuple, sympy.MatrixBase)):
        try:
            return expr.doit()
        except (TypeError, ValueError, NotImplementedError):
            return expr
    if isinstance(expr, tuple):
        return tuple(_evaluated(x) for x in expr)
    return expr


def _region(expr: Any) -> Any:
    """The set of reals an interval, a union, `x \\in S`, an inequality, a conjunction or a list of alternatives
    (`x<-2 or x>2`) in one variable describes; None for anything else (a number, a list of values)."""
    import sympy

    if isinstance(expr, sympy.Eq) and isinstance(expr.rhs, sympy.Set) and isinstance(expr.lhs, sympy.Symbol):
        expr = expr.rhs  # x \\in [1, 3]
    if isinstance(expr, (sympy.Interval, sympy.Union, sympy.Complement, sympy.Intersection)):
        return expr
    relations = list(expr.args) if isinstance(expr, sympy.FiniteSet) else [expr]
    if not all(isinstance(r, (sympy.Rel, sympy.And, sympy.Or)) and not isinstance(r, sympy.Eq) for r in relations):
        return None
    symbols = set().union(*(r.free_symbols for r in relations))
    if len(symbols) != 1:
        return None
    try:
        return sympy.Union(*(r.as_set() for r in relations))
    except (NotImplementedError, TypeError, ValueError):
        return None


def _same_equation(gold: Any, pred: Any) -> bool:
    """`2x = 10` and `x = 5`: one equation with its sides moved or scaled (math-verify takes `x = 5` for 5)."""
    import sympy

    if not (isinstance(gold, sympy.Eq) and isinstance(pred, sympy.Eq)):
        return False
    try:
        ratio = sympy.simplify((gold.lhs - gold.rhs) / (pred.lhs - pred.rhs))
    except (TypeError, ValueError, ZeroDivisionError):
        return False
    return bool(ratio.is_number and ratio != 0 and ratio.is_finite)


def _decimals(expr: Any) -> set[Any]:
    import sympy

    return expr.atoms(sympy.Float) if isinstance(expr, sympy.Basic) else set()


def _exact(expr: Any) -> Any:
    """Decimals as the exact fractions they spell (0.333 is 333/1000, not 1/3)."""
    import sympy

    return expr.xreplace({f: sympy.Rational(str(f)) for f in _decimals(expr)})


def _settle_decimals(gold: Any, pred: Any, verdict: bool, gold_text: str) -> bool:
    """math-verify compares numbers rounded to 6 places, so 0.3333333 would earn 1/3. A decimal answer must
    equal the reference exactly; an exact answer against a decimal reference must round to it."""
    import sympy

    scalar = all(isinstance(x, sympy.Expr) and not x.free_symbols for x in (gold, pred))
    if not scalar:
        return verdict
    try:
        if _decimals(pred):
            return bool(sympy.simplify(_exact(gold) - _exact(pred)) == 0)
        if _decimals(gold):
            places = max((len(d) for d in re.findall(r"\.(\d+)", gold_text)), default=0)
            return verdict or abs(float(sympy.N(pred - _exact(gold), 30))) <= 0.5 * 10.0**-places
    except (TypeError, ValueError, AttributeError):
        return verdict
    return verdict


@functools.lru_cache(maxsize=4096)  # a reference answer is judged against many samples
def _parse(text: str) -> tuple[Any, ...]:
    from math_verify import parse

    return tuple(parse(text, parsing_timeout=None))


def judge(gold: str, pred: str) -> bool:
    """Whether `pred` (a box's content, or a whole response) gives the reference answer `gold`."""
    from math_verify import verify

    if is_text(pred):  # a whole response: math-verify finds the answer in it
        return bool(verify(list(_parse(_as_math(gold))), list(_parse(_as_math(pred))), timeout_seconds=None))
    gold_is_text = is_text(gold)  # a reference may be a sentence with $...$ (math-verify's own suite)
    gold_latex = gold if gold_is_text else read_answer(gold, pred)
    pred_latex = read_answer(pred, gold)
    g = _with_imaginary_unit(list(_parse(_as_math(gold_latex) if gold_is_text else f"${gold_latex}$")))
    p = _with_imaginary_unit(list(_parse(f"${pred_latex}$")))
    g[:1], p[:1] = [_evaluated(x) for x in g[:1]], [_evaluated(x) for x in p[:1]]
    if not g or not p:
        return False
    region = _region(g[0])
    if region is None and hedged(gold_latex, pred_latex):
        return False
    if region is not None and (wanted := _region(p[0])) is not None:
        # sympy keeps sets canonical: (2, oo) from x > 2 is Interval.open(2, oo)
        return bool(_exact(region) == _exact(wanted))
    # float_rounding=12, not math-verify's 6: inside tuples, sets and matrices too, 1.0000001 is not 1
    verdict = bool(verify(g, p, float_rounding=12, allow_set_relation_comp=region is not None, timeout_seconds=None))
    return _settle_decimals(g[0], p[0], verdict or _same_equation(g[0], p[0]), gold_latex)


def readable(gold: str) -> bool:
    """Whether a reference answer can be matched at all: one the judge does not find equal even to itself (an
    empty box, a bare `\\text{}`) scores 0 against every answer."""
    return judge(gold, gold)


def plain_math_verify(gold: str, pred: str, as_math: bool = False) -> bool:
    """The peer the judge is measured against: `verify(parse(gold), parse(pred))` with math-verify's defaults,
    reading the answers as they are or (`as_math`) inside `$...$`; an exception is a False verdict."""
    from math_verify import parse, verify

    wrap = (lambda s: f"${s}$") if as_math else (lambda s: s)
    try:
        return bool(verify(parse(wrap(gold)), parse(wrap(pred))))
    except Exception:
        return False


# ------------------------------------------------------------------ the worker process


def install_two_stage_latex_parsing() -> bool:
    """Make math-verify's LaTeX parser (latex2sympy2's ANTLR grammar) try ANTLR's fast SLL prediction first
    and fall back to full LL only when that raises. ANTLR guarantees that an SLL parse without a syntax error
    is the tree LL would build, and any error (syntax or conversion) re-runs the original LL parse, so results
    are unchanged; parsing, ~85% of math-verify's time, gets about 2x faster. Inputs nested deeper than 12
    brackets keep plain LL (see below). Returns False, changing nothing, when latex2sympy2's internals are not
    the ones this was written against (1.11)."""
    try:
        from antlr4.atn.PredictionMode import PredictionMode
        from latex2sympy2_extended import latex2sympy2

        converter = latex2sympy2._Latex2Sympy
        create_parser, parse = converter.create_parser, converter.parse
    except (ImportError, AttributeError):
        return False

    def create_parser_in_mode(self: Any, latex_str: str) -> Any:
        parser = create_parser(self, latex_str)
        parser._interp.predictionMode = getattr(self, "_retool_prediction_mode", PredictionMode.LL)
        return parser

    def parse_sll_then_ll(self: Any, latex_str: str) -> Any:
        self._retool_prediction_mode = PredictionMode.LL
        if _bracket_depth(latex_str) > 12:  # deep nesting: LL may hit Python's recursion limit where SLL
            return parse(self, latex_str)  # would not, and SLL can take minutes; keep the original behaviour
        self._retool_prediction_mode = PredictionMode.SLL
        try:
            return parse(self, latex_str)
        except Exception:
            self._retool_prediction_mode = PredictionMode.LL
            return parse(self, latex_str)

    converter.create_parser, converter.parse = create_parser_in_mode, parse_sll_then_ll
    return True


def _bracket_depth(text: str) -> int:
    depth = deepest = 0
    for char in text:
        if char in "({[":
            depth += 1
            deepest = max(deepest, depth)
        elif char in ")}]":
            depth -= 1
    return deepest


def judge_worker_main() -> None:
    """A judge process: one JSON line [gold, pred] in, one JSON line (the verdict) out; [gold, null]: whether the
    reference reads as math."""
    import logging
    import signal

    # The host process decides when a judge stops (it kills it, or closes its pipe): a stop signal meant for the
    # run (Ctrl-C in a terminal) must not print a traceback here.
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1):
        signal.signal(sig, signal.SIG_IGN)
    logging.getLogger("math_verify").setLevel(logging.ERROR)  # it warns that we disabled its alarm timeouts
    install_two_stage_latex_parsing()
    import math_verify  # noqa: F401  (imported before "ready": import time is not a pair's time)

    try:
        print("ready", flush=True)
        for line in sys.stdin:
            gold, pred = json.loads(line)
            try:
                verdict = judge(gold, pred) if pred is not None else readable(gold)
            except Exception:
                verdict = False
            print(json.dumps(verdict), flush=True)
    except BrokenPipeError:  # the host is gone (or closed us): nothing to answer
        import os

        os._exit(0)
