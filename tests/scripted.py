"""A test engine that replays scripted turns through the real tokenizer (a stand-in for the model)."""

from __future__ import annotations

from collections.abc import Callable

from retool_cli.interfaces import Generation, Sampling


class ScriptedEngine:
    """`script(context_text, turn_index) -> next turn text`; honours budgets and stop strings like a model."""

    def __init__(self, tokenizer, script: Callable[[str, int], str]) -> None:
        self.tokenizer = tokenizer
        self.script = script
        self.seen_prompts: list[list[int]] = []  # every context it was asked to continue, as ids

    def generate(
        self,
        prompts: list[list[int]],
        max_new_tokens: list[int],
        stop_strings: list[str],
        sampling: Sampling,
        seeds: list[int] | None = None,
    ) -> list[Generation]:
        out = []
        for prompt, budget in zip(prompts, max_new_tokens, strict=True):
            self.seen_prompts.append(list(prompt))
            context = self.tokenizer.decode(prompt)
            # tool results as the protocols render them (a system prompt may mention the tags in prose)
            turn = self.script(context, context.count("<interpreter>\n") + context.count("<tool_response>\n"))
            ids = self.tokenizer.encode(turn, add_special_tokens=False)
            if len(ids) > budget:
                out.append(Generation(ids[:budget], [0.0] * budget, "length"))
            elif ids and ids[-1] == self.tokenizer.eos_token_id:
                out.append(Generation(ids, [0.0] * len(ids), "eos"))
            else:
                finish = "stop" if any(turn.endswith(s) for s in stop_strings) else "length"
                out.append(Generation(ids, [0.0] * len(ids), finish))
        return out

    def update_weights(self, policy: object) -> None:
        """Nothing to refresh: the script is the model."""

    def sleep(self) -> None:
        """Nothing held between batches."""

    def wake_up(self) -> None:
        """Nothing to restore."""
