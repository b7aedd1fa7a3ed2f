"""reward.py: extraction, the fast path, the killable math-verify judge and the reward functions."""

from __future__ import annotations

import signal
import threading

import pytest

from retool_cli.config import RewardConfig, RewardFunction
from retool_cli.env.reward import (
    Response,
    Verifier,
    answer_text,
    exact_number,
    extract_boxed,
    fast_verdict,
    normalize_answer,
    reward_metrics,
    score,
    score_batch,
)


@pytest.fixture(scope="module")
def verifier():
    with Verifier(timeout_s=10.0, workers=2) as judge:
        yield judge


# ------------------------------------------------------------------ extraction


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("so \\boxed{42}.", "42"),
        ("\\boxed{\\frac{1}{\\sqrt{2}}}", "\\frac{1}{\\sqrt{2}}"),  # nested braces
        ("first \\boxed{1} then \\boxed{2}", "2"),  # the last box wins
        ("\\boxed 5 done", "5"),
        ("\\fbox{7}", "7"),
        ("\\boxed{\\{1, 2\\}}", "\\{1, 2\\}"),
        ("no answer here", None),
        ("\\boxed{1} and then \\boxed{\\frac{1}{2}", None),  # the last one is cut off
        ("\\boxed", None),
        ("\\boxed{}", ""),
        ("\\boxed {5}.", "5"),  # a space before the brace is legal LaTeX
        ("\\boxed\n{3}", "3"),
        ("\\boxed {1", None),
        ("\\boxed{\\left\\{ x^2 \\right.}", "\\left\\{ x^2 \\right."),  # escaped braces do not group
        ("\\boxed{a \\} b}", "a \\} b"),
        (
            "\\boxed{\\left\\{\\begin{array}{ll} x & x>0 \\\\ 0 & x\\le 0\\end{array}\\right.}",
            "\\left\\{\\begin{array}{ll} x & x>0 \\\\ 0 & x\\le 0\\end{array}\\right.",
        ),  # a line break before {
        ("\\text{The answer is \\boxed{7}}", "7"),  # a box inside \\text{}
    ],
)
def test_extract_boxed(text: str, expected: str | None) -> None:
    assert extract_boxed(text) == expected


def test_extract_boxed_window() -> None:
    early = "\\boxed{3}" + " reasoning" * 50
    assert extract_boxed(early) == "3"
    assert extract_boxed(early, window=300) is None  # an early guess far from the end is not the answer
    assert extract_boxed(early + " final \\boxed{4}", window=300) == "4"


def test_answer_text_ignores_code_and_tool_output() -> None:
    text = (
        "Let me compute.<code>```python\nprint('\\\\boxed{99}')\n```</code>"
        "<interpreter>\\boxed{99}</interpreter> So the answer is \\boxed{12}."
    )
    assert extract_boxed(answer_text(text)) == "12"
    only_tool = "<code>x</code><interpreter>\\boxed{99}</interpreter> I am not sure."
    assert extract_boxed(answer_text(only_tool)) is None
    unterminated_tool = "answer \\boxed{5} <interpreter>\\boxed{6}"
    assert extract_boxed(answer_text(unterminated_tool)) == "5"


# ------------------------------------------------------------------ the fast path


@pytest.mark.parametrize(
    ("raw", "normal"),
    [
        ("  \\left( 1, 2 \\right) ", "(1,2)"),
        ("\\dfrac{1}{2}", "\\frac{1}{2}"),
        ("\\text{Paris}", "Paris"),
        ("1,234,567", "1234567"),
        ("90^\\circ", "90"),
        ("50\\%", "50"),
        ("x = 5", "5"),
        ("$7$", "7"),
    ],
)
def test_normalize_answer(raw: str, normal: str) -> None:
    assert normalize_answer(raw) == normal


def test_exact_number() -> None:
    assert exact_number("025") == 25
    assert exact_number("-2.50") * 2 == -5
    assert exact_number("\\frac{3}{4}") == exact_number("3/4") == exact_number("0.75")
    assert exact_number("\\frac{1}{0}") is None and exact_number("x") is None


@pytest.mark.parametrize(
    ("gold", "pred", "verdict"),
    [
        ("025", "25", True),
        ("1000", "1,000", True),
        ("5", "5.0", True),
        ("\\frac{1}{2}", "\\dfrac12", None),  # not an exact form the fast path reads: math-verify decides
        ("\\frac{3}{4}", "0.75", True),
        ("7", "8", False),
        ("7", "7.5", None),  # a decimal may be a rounding: math-verify decides
        ("\\sqrt{2}", "2^{1/2}", None),
    ],
)
def test_fast_verdict(gold: str, pred: str, verdict: bool | None) -> None:
    assert fast_verdict(gold, pred) is verdict


# ------------------------------------------------------------------ equivalence through math-verify


@pytest.mark.parametrize(
    ("gold", "pred", "expected"),
    [
        ("\\frac{1}{2}", "0.5", True),
        ("\\frac{1}{2}", "\\frac{2}{4}", True),
        ("\\sqrt{8}", "2\\sqrt{2}", True),
        ("\\sqrt{8}", "2\\sqrt{3}", False),
        ("(1, 2]", "(1,2]", True),
        ("[1, 2]", "(1, 2]", False),
        ("\\{1, 2, 3\\}", "\\{3, 2, 1\\}", True),
        ("(3, 4)", "(4, 3)", False),
        (
            "\\begin{pmatrix}1 & 2\\\\3 & 4\\end{pmatrix}",
            "\\begin{pmatrix}1 & 2\\\\3 & 4\\end{pmatrix}",
            True,
        ),
        ("1.5\\times10^{3}", "1500", True),
        ("3\\text{ cm}", "3", True),
        ("x^2 + 2x + 1", "(x+1)^2", True),
        ("3.14159", "3.1416", False),  # close is not equal
        ("\\frac{\\pi}{2}", "\\frac{\\pi}{3}", False),
        ("073", "73", True),
    ],
)
def test_is_equivalent_hand_written_pairs(verifier: Verifier, gold: str, pred: str, expected: bool) -> None:
    assert verifier.is_equivalent(gold, pred) is expected


def test_cache_and_counts(verifier: Verifier) -> None:
    before = verifier.counts["cache"]
    first = verifier.verify("\\frac{2}{6}", "\\frac{1}{3}")
    again = verifier.verify("\\frac{2}{6}", "\\frac{1}{3}")
    assert first.equivalent and again.equivalent and again.path == "cache"
    assert verifier.counts["cache"] == before + 1


def test_timeout_is_hard_from_a_thread_and_the_pool_recovers() -> None:
    with Verifier(timeout_s=30.0, workers=1) as judge:
        assert judge.is_equivalent("\\frac{1}{2}", "0.5")  # the worker is up and warm
        worker = judge._idle.queue[0]
        judge.timeout_s = 0.001  # far below what sympy needs for the next pair
        results: list = []
        thread = threading.Thread(target=lambda: results.append(judge.verify("\\sin(x)^2 + \\cos(x)^2", "1")))
        thread.start()
        thread.join()
        assert results[0].timed_out and not results[0].equivalent
        # the bound was kept by killing the busy worker (not by waiting for its answer), and it was replaced
        assert worker.proc.returncode == -signal.SIGKILL
        assert judge._idle.queue[0] is not worker
        assert judge.counts["timeout"] == 1
        judge.timeout_s = 30.0  # the killed worker was replaced: the next pair gets a real verdict
        assert judge.verify("\\sin(x)^2 + \\cos(x)^2", "1").equivalent


# ------------------------------------------------------------------ reward functions


def test_correctness_reward(verifier: Verifier) -> None:
    cfg = RewardConfig(max_response_tokens=100)
    right = score("thinking... \\boxed{\\frac12}", "0.5", cfg, verifier)
    assert (right.reward, right.correct, right.formatted, right.extracted) == (1.0, True, True, "\\frac12")
    wrong = score("\\boxed{3}", "4", cfg, verifier)
    assert (wrong.reward, wrong.correct, wrong.formatted) == (-1.0, False, True)
    missing = score("I think it is 4", "4", cfg, verifier)
    assert (missing.reward, missing.formatted, missing.extracted) == (-1.0, False, None)
    cut = score("\\boxed{4}", "4", cfg, verifier, truncated=True)
    assert (cut.reward, cut.correct, cut.truncated) == (-1.0, False, True)
    tool_only = score("<interpreter>\\boxed{4}</interpreter>", "4", cfg, verifier)
    assert tool_only.reward == -1.0


def test_dapo_strict_is_exact_string(verifier: Verifier) -> None:
    cfg = RewardConfig(function=RewardFunction.dapo_strict, max_response_tokens=100)
    assert score("\\boxed{025}", "025", cfg, verifier).reward == 1.0
    assert score("\\boxed{25}", "025", cfg, verifier).reward == -1.0
    assert score("\\boxed{25}" + "x" * 120, "25", cfg, verifier).reward == -1.0  # outside the last 100 chars


def test_overlong_penalty_and_format_weight(verifier: Verifier) -> None:
    cfg = RewardConfig(overlong_buffer_tokens=20, overlong_penalty_factor=1.0, max_response_tokens=100)
    # within the buffer: linear from 0 at 80 tokens to -1 at 100
    assert score("\\boxed{4}", "4", cfg, verifier, response_tokens=80).reward == 1.0
    assert score("\\boxed{4}", "4", cfg, verifier, response_tokens=90).reward == pytest.approx(0.5)
    assert score("\\boxed{4}", "4", cfg, verifier, response_tokens=130).reward == pytest.approx(0.0)
    fmt = RewardConfig(format_weight=0.1, max_response_tokens=100)
    assert score("\\boxed{5}", "4", fmt, verifier).reward == pytest.approx(-0.9)


def test_score_batch_is_deterministic_and_metrics(verifier: Verifier) -> None:
    cfg = RewardConfig(max_response_tokens=100)
    items = [
        Response("\\boxed{1}", "1", False, 5),
        Response("\\boxed{2}", "1", False, 5),
        Response("none", "1", False, 5),
        Response("\\boxed{1}", "1", True, 5),
    ]
    first, second = score_batch(items, cfg, verifier), score_batch(items, cfg, verifier)
    assert first == second
    assert [s.reward for s in first] == [1.0, -1.0, -1.0, -1.0]
    metrics = reward_metrics(first)
    assert (
        metrics["reward/correct"] == 0.25
        and metrics["reward/formatted"] == 0.75
        and metrics["reward/truncated"] == 0.25
    )


TWO_STAGE_CHECK = r"""
import json, sys
from latex2sympy2_extended.latex2sympy2 import latex2sympy
from retool_cli.env.judge import install_two_stage_latex_parsing

def parsed(text):
    try:
        return repr(latex2sympy(text))
    except Exception as error:
        return "error: " + type(error).__name__

texts = json.loads(sys.argv[1])
before = [parsed(t) for t in texts]
assert install_two_stage_latex_parsing()
after = [parsed(t) for t in texts]
print(json.dumps([before, after]))
"""


def test_two_stage_latex_parsing_builds_the_same_expressions() -> None:
    """SLL-then-LL parsing (installed in the judge workers) gives what plain LL parsing gives, for inputs that
    SLL parses, inputs that need the LL fallback (sets, intervals, comma lists), and invalid ones."""
    import json
    import subprocess
    import sys

    # the last 3 need the LL fallback
    texts = [
        "\\frac{3}{4}",
        "2\\sqrt{3}+1",
        "(1, 2]",
        "\\{1, 2, 3\\}",
        "(-\\infty, -2) \\cup (3, \\infty)",
        "1, 2, 3",
        "\\begin{pmatrix} 1 & 2 \\\\ 3 & 4 \\end{pmatrix}",
        "x \\le 3",
        "10,080",
        "3 + 4i",
        "\\left( 3, \\frac{\\pi}{2} \\right)",
        "\\frac{1}{",
        "}{",
        "\\text{(E)}",
        "f(x) = x^2 + 1",
        "(" * 12 + "x" + ")" * 12,
        "(" * 14 + "x" + ")" * 14,  # deeper than 12: plain LL
        "x^5 - x^4 + x^3 - x^2 + x - 1",
        "8n^2 + 4n + 1",
        "V_{1}:V_{2}=11:21",
    ]
    out = subprocess.run(
        [sys.executable, "-c", TWO_STAGE_CHECK, json.dumps(texts)], capture_output=True, text=True, check=True
    )
    before, after = json.loads(out.stdout)
    assert after == before
    assert any(b.startswith("error") for b in before) and any(not b.startswith("error") for b in before)


def test_readable_references_are_judged_once_per_run() -> None:
    """A reference no answer can match is found (judge(g, g) is false); asked again (train's periodic evals),
    the answer comes from the run's memory, not the workers."""
    with Verifier(workers=1) as verifier:
        golds = ["42", "\\frac{1}{2}", "\\text{}", "x^2+1"]
        assert verifier.readable_many(golds) == [True, True, False, True]
        slow = verifier.counts["slow"]
        assert slow == 2  # exact numbers (42, 1/2) settle without the judge
        assert verifier.readable_many(golds) == [True, True, False, True]
        assert verifier.counts["slow"] == slow
