"""Which trajectories of a tool-integrated rollout batch the update learns from (each off unless a recipe turns it
on, each counted in metrics.jsonl):

- void turns (SimpleTIR, arXiv 2509.02479): a turn that neither makes a well-formed call nor answers
  (Trajectory.void_turns, counted by the agent loop); `trainer.filter_void_turns` masks such trajectories
  from the loss in rl/step.update.
- GRPO-RoC (rStar2-Agent, arXiv 2508.20722): `trainer.roc_oversample` samples k x group_size per question and
  keeps group_size (`roc_select`, below): wrong trajectories uniformly at random, correct ones with the fewest
  tool errors and format problems, so that a correct answer reached through failing code is not reinforced.
- the cap on code calls per trajectory (`rollout.max_code_calls`, stop reason `code_budget`) and the
  interpreter's error output cut to its last lines (`rollout.error_tail_lines`; ToRL keeps one) live in the
  agent loop and the code interpreter.
"""

from __future__ import annotations

import random
from typing import Any

from retool_cli.rollout.agent import Trajectory


def tool_errors(t: Trajectory) -> int:
    """Calls that failed: an exception, a time-out, a kill."""
    return sum(o.status != "ok" for o in t.tool_outputs)


def format_problems(t: Trajectory, score: Any) -> int:
    """Void turns (malformed calls among them) and a final answer not where the reward looks for it."""
    return t.void_turns + (not score.formatted)


def roc_select(
    trajectories: list[Trajectory], scores: list[Any], group_size: int, oversample: int, seed: int
) -> tuple[list[int], dict[str, float]]:
    """Indices (in batch order) of `group_size` trajectories per question out of the k x group_size sampled
    (question-major, as run_rollouts returns them), and what the selection did. Each group keeps its share of
    correct answers (rounded, at least one of each kind the group has when group_size > 1); the wrong ones
    are drawn uniformly, the correct ones ranked by tool errors + format problems (ties drawn at random)."""
    rng = random.Random(seed)
    sampled = group_size * oversample
    kept: list[int] = []
    for start in range(0, len(trajectories), sampled):
        members = list(range(start, start + sampled))
        right = [i for i in members if scores[i].correct]
        wrong = [i for i in members if not scores[i].correct]
        n_right = int(group_size * len(right) / len(members) + 0.5)
        if group_size > 1 and right and wrong:
            n_right = min(max(n_right, 1), group_size - 1)
        n_right = min(n_right, len(right))
        n_right = max(n_right, group_size - len(wrong))
        draws = {i: rng.random() for i in right}
        ranked = sorted(right, key=lambda i: (_penalty(trajectories[i], scores[i]), draws[i]))
        kept += ranked[:n_right] + rng.sample(wrong, group_size - n_right)
    kept.sort()

    def mean_penalty(indices: list[int]) -> float:  # of the correct ones
        right = [i for i in indices if scores[i].correct]
        return sum(_penalty(trajectories[i], scores[i]) for i in right) / max(1, len(right))

    metrics = {
        "rollout/roc_sampled": float(len(trajectories)),
        "rollout/roc_correct_penalty_before": mean_penalty(list(range(len(trajectories)))),
        "rollout/roc_correct_penalty_after": mean_penalty(kept),
    }
    return kept, metrics


def _penalty(t: Trajectory, score: Any) -> int:
    return tool_errors(t) + format_problems(t, score)
