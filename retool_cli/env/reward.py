"""The reward: find the final answer, judge it against the reference, turn the verdict into a score.

    final assistant text --answer_text (drop code, tool output)--> --extract_boxed (last window chars)-->
      answer --Verifier: cache -> exact fast path -> judge.judge in killable worker processes-->
      verdict --score (correctness | dapo_strict, + optional overlong and format terms)--> RewardScore

The judge is the only training signal and eval's referee: the fast path only ever says "equivalent"
for pairs that are identical after a conservative normalisation or equal as exact numbers; anything
else goes to the judge (judge.py: a box's content read as math by math-verify, hedges refused), whose
run time is bounded by killing its worker process, from any thread.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import queue
import re
import select
import subprocess
import sys
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from fractions import Fraction
from typing import IO

from retool_cli.config import RewardConfig, RewardFunction
from retool_cli.env.judge import THOUSANDS
from retool_cli.interfaces import Judge, Verdict

# ------------------------------------------------------------------ extraction

_BOX_COMMANDS = ("\\boxed", "\\fbox")
# Spans whose \boxed{} is never the answer: code the model wrote and what tools printed.
_NON_ANSWER_SPANS = re.compile(
    r"<code>.*?(?:</code>|$)|<interpreter>.*?(?:</interpreter>|$)|<tool_call>.*?(?:</tool_call>|$)"
    r"|<tool_response>.*?(?:</tool_response>|$)|```.*?(?:```|$)",
    re.DOTALL,
)


def answer_text(text: str) -> str:
    """The text an answer may be taken from: code blocks, tool calls and tool output removed."""
    return _NON_ANSWER_SPANS.sub(" ", text)


def extract_boxed(text: str, window: int | None = None) -> str | None:
    """Content of the last complete `\\boxed{...}` (nested braces), `\\boxed 5` or `\\fbox{...}`.

    With `window`, only a box that starts within the last `window` characters counts. None when there is
    no box, or when the last one is unterminated (a cut-off answer is no answer).
    """
    start = max((text.rfind(cmd) for cmd in _BOX_COMMANDS), default=-1)
    if start < 0 or (window is not None and start < len(text) - window):
        return None
    command = next(cmd for cmd in _BOX_COMMANDS if text.startswith(cmd, start))
    rest = text[start + len(command) :]
    spaced = rest.lstrip()  # "\boxed {5}" is legal LaTeX: spaces (or a line break) before the brace
    if spaced.startswith("{"):
        return _braced(spaced)
    if rest.startswith(" "):  # "\boxed 5": up to the next space or "$"
        match = re.match(r" +([^\s$]+)", rest)
        return match.group(1) if match else None
    return None


def _braced(text: str) -> str | None:
    """The content of the group `text` opens with `{`, or None when it never closes. A backslash escapes the
    next character: escaped braces (sets, the `\\left\\{ ... \\right.` of piecewise answers) do not group, and
    a LaTeX line break (two backslashes) escapes no brace after it."""
    depth, i = 0, 0
    while i < len(text):
        char = text[i]
        if char == "\\":
            i += 2
            continue
        depth += (char == "{") - (char == "}")
        if depth == 0:
            return text[1:i].strip()
        i += 1
    return None


# ------------------------------------------------------------------ the fast path

_WRAPPERS = re.compile(r"\\(?:text|textbf|mathrm|mathbf|operatorname)\{([^{}]*)\}")
_DROP = re.compile(r"\\left|\\right|\\!|\\,|\\;|\\:|\\ |\\displaystyle|\$|\s")
_DEGREES = re.compile(r"\^\{?\\circ\}?|°")
_PERCENT = re.compile(r"\\?%$")
_VARIABLE_PREFIX = re.compile(r"^[a-zA-Z]=(?=[^=])")
_NUMBER = re.compile(r"^-?\d+(?:\.\d+)?$")
_FRAC = re.compile(r"^(-?)\\frac\{(-?\d+)\}\{(\d+)\}$|^(-?\d+)/(\d+)$")


def normalize_answer(text: str) -> str:
    """A conservative canonical form: only rewrites that never change a value."""
    text = text.strip()
    text = _WRAPPERS.sub(r"\1", text)
    text = text.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    text = _DROP.sub("", text)
    text = _DEGREES.sub("", text)
    text = _PERCENT.sub("", text)
    text = _VARIABLE_PREFIX.sub("", text)
    if THOUSANDS.match(text):
        text = text.replace(",", "")
    if text.endswith(".") and _NUMBER.match(text[:-1]):
        text = text[:-1]
    return text


def exact_number(text: str) -> Fraction | None:
    """The exact value of an integer, decimal or simple fraction ("025", "2.50", "\\frac{3}{4}", "-3/4")."""
    if _NUMBER.match(text):
        return Fraction(text)
    match = _FRAC.match(text)
    if match:
        sign, num, den = (
            (match.group(1), match.group(2), match.group(3)) if match.group(2) else ("", match.group(4), match.group(5))
        )
        if int(den) != 0:
            return Fraction(int(num), int(den)) * (-1 if sign else 1)
    return None


def fast_verdict(gold: str, pred: str) -> bool | None:
    """True/False when cheap rules settle the pair, None when math-verify must decide."""
    g, p = normalize_answer(gold), normalize_answer(pred)
    if not g or not p:
        return None
    if g == p:
        return True
    g_num, p_num = exact_number(g), exact_number(p)
    if g_num is not None and p_num is not None:
        # integers compare exactly; a decimal against anything may be a rounding (math-verify's call)
        if g_num == p_num:
            return True
        if g_num.denominator == 1 and p_num.denominator == 1 and "." not in g + p:
            return False
    return None


# ------------------------------------------------------------------ the slow path: the judge, killable


class _JudgeProcess:
    """A subprocess (not multiprocessing: that would re-import the caller's main script) we can kill."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", "from retool_cli.env.judge import judge_worker_main; judge_worker_main()"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            bufsize=1,
            start_new_session=True,  # a terminal's Ctrl-C (or torchrun's signal to a rank's group) is not its
        )
        self.ready = False

    def wait_ready(self) -> None:
        """The import time of math-verify and sympy is not counted against a pair's time bound."""
        if not self.ready:
            assert self.proc.stdout is not None
            if not _readable(self.proc.stdout, 120) or self.proc.stdout.readline().strip() != "ready":
                raise RuntimeError("math-verify worker failed to start")
            self.ready = True

    def verify(self, gold: str, pred: str | None, timeout_s: float) -> bool | None:
        """The verdict, or None on timeout (the caller then kills this process)."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps([gold, pred]) + "\n")
        self.proc.stdin.flush()
        if not _readable(self.proc.stdout, timeout_s):
            return None
        verdict: bool | None = json.loads(self.proc.stdout.readline())
        return verdict

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()
        for pipe in (self.proc.stdin, self.proc.stdout):
            with contextlib.suppress(OSError):
                pipe.close()  # type: ignore[union-attr]


def _readable(stream: IO[str], timeout_s: float) -> bool:
    return bool(select.select([stream], [], [], timeout_s)[0])


class Verifier:
    """Equivalence judge with a per-run cache and a hard time bound per pair, usable from any thread."""

    def __init__(self, timeout_s: float = 5.0, workers: int = 2) -> None:
        self.timeout_s = timeout_s
        self._idle: queue.Queue[_JudgeProcess] = queue.Queue()
        self._started: list[_JudgeProcess] = []  # every worker process, killed at close
        self._lock = threading.Lock()
        for _ in range(workers):  # start importing math-verify now, in the background
            self._idle.put(self._spawn())
        self._cache: dict[tuple[str, str], bool] = {}
        self._readable: dict[str, bool] = {}  # reference -> whether any answer can match it
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="verify")
        self.counts: Counter[str] = Counter()

    def is_equivalent(self, gold: str, pred: str) -> bool:
        return self.verify(gold, pred).equivalent

    def verify(self, gold: str, pred: str) -> Verdict:
        key = (gold, pred)
        with self._lock:
            cached = self._cache.get(key)
        if cached is not None:
            self._count("cache")
            return Verdict(cached, path="cache")
        fast = fast_verdict(gold, pred)
        if fast is not None:
            self._count("fast")
            verdict = Verdict(fast, path="fast")
        else:
            verdict = self._slow(gold, pred)
        if not verdict.timed_out:
            with self._lock:
                self._cache[key] = verdict.equivalent
        return verdict

    def verify_many(self, pairs: list[tuple[str, str]]) -> list[Verdict]:
        """Verdicts in input order; slow pairs run concurrently over the worker processes."""
        return list(self._pool.map(lambda pair: self.verify(*pair), pairs))

    def readable_many(self, golds: list[str]) -> list[bool]:
        """Whether each reference answer reads as math (one that does not is judged wrong against every answer,
        so a benchmark or a training set must say how many it has). A number is; the rest ask the judge."""

        def one(gold: str) -> bool:
            if exact_number(normalize_answer(gold)) is not None:
                return True
            with self._lock:
                known = self._readable.get(gold)
            if known is not None:  # train's periodic evals ask about the same references each time
                return known
            verdict = self._slow(gold, None)
            readable = verdict.equivalent or verdict.timed_out  # a reading that ran out of time is not "unreadable"
            if not verdict.timed_out:
                with self._lock:
                    self._readable[gold] = readable
            return readable

        return list(self._pool.map(one, golds))

    def _slow(self, gold: str, pred: str | None) -> Verdict:
        process = self._idle.get()
        try:
            process.wait_ready()
            started = time.monotonic()
            result = process.verify(gold, pred, self.timeout_s)
        except (OSError, ValueError, RuntimeError):  # a broken worker: replace it, judge the pair as wrong
            result, started = False, time.monotonic()
            process.kill()
            process = self._spawn()
        if result is None:  # timed out: kill it (the only way to stop C code) and start a fresh one
            process.kill()
            self._idle.put(self._spawn())
            self._count("timeout")
            return Verdict(False, timed_out=True, path="slow")
        self._idle.put(process)
        self._count("slow")
        self._count_time(time.monotonic() - started)
        return Verdict(bool(result), path="slow")

    def _count(self, what: str) -> None:
        with self._lock:
            self.counts[what] += 1

    def _count_time(self, seconds: float) -> None:
        with self._lock:
            self.counts["slow_ms"] += int(seconds * 1000)

    def _spawn(self) -> _JudgeProcess:
        process = _JudgeProcess()
        with self._lock:
            self._started.append(process)
        return process

    def close(self) -> None:
        """Stop at once (a stopping run does not wait for pairs in flight): pairs not started are dropped and every
        worker is killed; a pair in flight is judged wrong, and nothing judged after close is used."""
        self._pool.shutdown(wait=False, cancel_futures=True)
        with self._lock:
            started = list(self._started)
        for process in started:
            process.kill()

    def __enter__(self) -> Verifier:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def unreadable_answers(golds: list[str], cfg: RewardConfig) -> list[int]:
    """Indices of the reference answers no answer can match (Verifier.readable_many); the judge's processes
    start only when some reference is not a plain number."""
    if all(exact_number(normalize_answer(g)) is not None for g in golds):
        return []
    with Verifier(cfg.judge_timeout_s, cfg.judge_workers) as verifier:
        return [i for i, ok in enumerate(verifier.readable_many(golds)) if not ok]


_default_verifier: Verifier | None = None


def is_equivalent(gold: str, pred: str) -> bool:
    """Mathematical equivalence of a reference and a predicted answer (module-wide verifier, 5 s bound)."""
    global _default_verifier
    if _default_verifier is None:
        _default_verifier = Verifier()
        atexit.register(_default_verifier.close)  # its worker processes end with the interpreter
    return _default_verifier.is_equivalent(gold, pred)


# ------------------------------------------------------------------ reward functions


@dataclass
class RewardScore:
    reward: float
    extracted: str | None  # the final answer found, or None
    correct: bool
    formatted: bool  # a complete boxed answer was found where it must be
    truncated: bool  # the response hit a length limit (never rewarded as correct)
    timed_out: bool  # the judge ran out of time: wrong in eval; void in training (left out of the update)
    overlong_penalty: float = 0.0


def dapo_strict_correct(final_text: str, gold: str) -> tuple[bool, str | None]:
    """verl's DAPO strict-box rule: the last box within the last 100 of the last 300 characters, compared
    with the reference as an exact string (so "25" is wrong against "025")."""
    extracted = extract_boxed(final_text[-300:][-100:])
    return extracted is not None and extracted.strip() == gold.strip(), extracted


@dataclass(frozen=True)
class Response:
    """What the reward needs of one trajectory (rollout.agent.Trajectory.response() makes one)."""

    text: str  # the model's own final text (tool output excluded)
    reference: str  # the reference answer
    truncated: bool = False  # stopped by a length limit (never rewarded as correct)
    tokens: int = 0  # response tokens, for the overlong penalty


def score_batch(responses: list[Response], cfg: RewardConfig, verifier: Judge) -> list[RewardScore]:
    """Score a batch of responses; the pairs the fast path cannot settle are judged concurrently."""
    if cfg.function is RewardFunction.dapo_strict:
        strict = [dapo_strict_correct(answer_text(r.text), r.reference) for r in responses]
        verdicts = [Verdict(ok) for ok, _ in strict]
        extracted = [found for _, found in strict]
    else:
        extracted = [extract_boxed(answer_text(r.text), cfg.answer_window_chars) for r in responses]
        to_check = [i for i, found in enumerate(extracted) if found is not None and not responses[i].truncated]
        judged = verifier.verify_many([(responses[i].reference, str(extracted[i])) for i in to_check])  # not None
        checked = dict(zip(to_check, judged, strict=True))
        verdicts = [checked.get(i, Verdict(False)) for i in range(len(responses))]
    return [
        _score(found, verdict, r.truncated, r.tokens, cfg)
        for r, found, verdict in zip(responses, extracted, verdicts, strict=True)
    ]


def _score(found: str | None, verdict: Verdict, truncated: bool, tokens: int, cfg: RewardConfig) -> RewardScore:
    correct = verdict.equivalent and not truncated and found is not None
    reward = 1.0 if correct else -1.0
    if cfg.format_weight and found is not None:
        reward += cfg.format_weight
    penalty = 0.0
    if cfg.overlong_buffer_tokens > 0:  # DAPO soft overlong punishment over the last buffer tokens
        exceed = tokens - (cfg.max_response_tokens - cfg.overlong_buffer_tokens)
        penalty = min(0.0, -exceed / cfg.overlong_buffer_tokens * cfg.overlong_penalty_factor)
        penalty = max(penalty, -cfg.overlong_penalty_factor)
        reward += penalty
    return RewardScore(reward, found, correct, found is not None, truncated, verdict.timed_out, penalty)


def score(
    final_text: str,
    gold: str,
    cfg: RewardConfig,
    verifier: Verifier,
    *,
    truncated: bool = False,
    response_tokens: int = 0,
) -> RewardScore:
    """Score one response (see score_batch)."""
    return score_batch([Response(final_text, gold, truncated, response_tokens)], cfg, verifier)[0]


def reward_metrics(scores: list[RewardScore]) -> dict[str, float]:
    """Batch means of every component, for train and eval logs."""
    n = max(1, len(scores))
    return {
        "reward/mean": sum(s.reward for s in scores) / n,
        "reward/correct": sum(s.correct for s in scores) / n,
        "reward/formatted": sum(s.formatted for s in scores) / n,
        "reward/truncated": sum(s.truncated for s in scores) / n,
        "reward/judge_timeouts": float(sum(s.timed_out for s in scores)),
        "reward/overlong_penalty": sum(s.overlong_penalty for s in scores) / n,
    }
