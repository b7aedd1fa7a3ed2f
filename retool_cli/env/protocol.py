"""How the model and the interpreter talk: prompts, tool-call formats, parsing turns, rendering results.

Three protocols, one interface (`prompt_ids`, `stop_strings`, `parse_call`, `result_ids`):

- `retool_tags` (the paper's): the model writes <code>```python ...```</code>; generation stops at
  </code>; the result is appended as <interpreter>...</interpreter> and the same assistant turn goes on.
- `chat_tool`: native tool calling through the tokenizer's chat template: the run's tools (env/tools.py; the
  code interpreter `code_interpreter(code)` unless told otherwise) in its tools section, Hermes/Qwen2.5/Qwen3
  JSON calls or Qwen3-Coder XML-parameter calls of any of them by name. Only new
  segments are rendered (close of the turn, tool message, next assistant header), from a template probed once
  with placeholders; a template that rewrites earlier turns (Qwen3's <think> blocks) follows
  protocol.template_policy (append, or refuse).
- `none`: text only (the baseline without a tool).

Token-in, token-out: the loop appends these ids to the ids it sampled; history is never re-encoded.
"""

from __future__ import annotations

import json
import logging
import re
from typing import Any

from retool_cli.config import ProtocolConfig, ProtocolName, TemplatePolicy
from retool_cli.env.text import neutralize as neutralize  # where outside checks call it (DESIGN.md)
from retool_cli.env.tools import CODE_INTERPRETER_SCHEMA, INTERPRETER
from retool_cli.errors import ConfigError, DataError
from retool_cli.interfaces import ToolCall

# ------------------------------------------------------------------ parsing calls

_FENCE = re.compile(r"```(?:python|py)?\s*\n?(.*?)```", re.DOTALL)
_XML_CALL = re.compile(r"<function=([\w.-]+)>\s*(.*?)\s*(?:</function>|$)", re.DOTALL)
_XML_PARAM = re.compile(r"<parameter=([\w.-]+)>\n?(.*?)\n?</parameter>", re.DOTALL)


def _code_from_block(block: str) -> str:
    fenced = _FENCE.search(block)
    return (fenced.group(1) if fenced else block).strip("\n")


def parse_tagged_call(turn_text: str) -> ToolCall:
    """The interpreter call of the last <code>...</code> block of a turn that stopped at </code>."""
    start = turn_text.rfind("<code>")
    end = turn_text.rfind("</code>")
    if start < 0 or end < start:
        return ToolCall(None, error="Error: a code block must start with <code> and end with </code>.")
    code = _code_from_block(turn_text[start + len("<code>") : end])
    if not code.strip():
        return ToolCall(None, error="Error: the code block is empty.")
    return ToolCall(INTERPRETER, {"code": code})


def parse_chat_call(turn_text: str, schemas: list[dict[str, Any]]) -> ToolCall:
    """A Hermes JSON or Qwen3-Coder XML-parameter call of one of the tools of `schemas`, from a turn ending in
    </tool_call>: its name known, its required arguments there, a required string one non-empty (a markdown
    fence around it taken off)."""
    start = turn_text.rfind("<tool_call>")
    end = turn_text.rfind("</tool_call>")
    if start < 0 or end < start:
        return ToolCall(None, error="Error: a tool call must be wrapped in <tool_call>...</tool_call>.")
    body = turn_text[start + len("<tool_call>") : end].strip()
    xml = _XML_CALL.search(body)
    if xml:
        name, arguments = xml.group(1), dict(_XML_PARAM.findall(xml.group(2)))
    else:
        try:
            call = json.loads(body)
        except json.JSONDecodeError as exc:
            return ToolCall(None, error=f"Error: the tool call is not valid JSON ({exc.msg}).")
        if not isinstance(call, dict):
            return ToolCall(None, error="Error: the tool call must be a JSON object with name and arguments.")
        name, arguments = call.get("name"), call.get("arguments", {})
    functions: dict[str, Any] = {schema["function"]["name"]: schema["function"] for schema in schemas}
    if name not in functions:
        known = (
            f"the only tool is {next(iter(functions))}"
            if len(functions) == 1
            else f"the tools are {', '.join(functions)}"
        )
        return ToolCall(None, error=f"Error: unknown tool {name!r}; {known}.")
    parameters = functions[name]["parameters"]
    required: list[str] = list(parameters.get("required", []))
    if isinstance(arguments, str):  # some models double-encode the arguments; a plain string is the one argument
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            arguments = {required[0]: arguments} if len(required) == 1 else arguments
    if not isinstance(arguments, dict):
        arguments = {}
    for key in required:
        value = arguments.get(key)
        if parameters.get("properties", {}).get(key, {}).get("type") != "string":
            if value is None:
                return ToolCall(None, error=f"Error: {name} needs an argument {key!r}.")
        elif not isinstance(value, str) or not value.strip():
            return ToolCall(None, error=f"Error: {name} needs a non-empty string argument {key!r}.")
        elif "```" in value:
            arguments = {**arguments, key: _code_from_block(value)}
    return ToolCall(name, arguments)


# ------------------------------------------------------------------ the protocols


class TaggedProtocol:
    """`retool_tags`, and `none` (the same prompt without the tool: no stop string, no calls)."""

    def __init__(self, tokenizer: Any, system_prompt: str, use_tool: bool = True) -> None:
        self.tokenizer = tokenizer
        self.system_prompt = system_prompt
        self.use_tool = use_tool
        self.stop_strings = ["</code>"] if use_tool else []

    def prompt_ids(self, question: str) -> list[int]:
        messages = [{"role": "system", "content": self.system_prompt}, {"role": "user", "content": question}]
        return _template_ids(self.tokenizer, messages, add_generation_prompt=True)

    def call_text(self, code: str) -> str:
        """The text with which the model calls the interpreter after its own text."""
        return f"\n<code>\n```python\n{code}\n```\n</code>"

    def parse_call(self, turn_text: str) -> ToolCall:
        return parse_tagged_call(turn_text)

    def result_ids(self, result_text: str) -> list[int]:
        return list(
            self.tokenizer.encode(f"\n<interpreter>\n{result_text}\n</interpreter>\n", add_special_tokens=False)
        )


class ChatToolProtocol:
    """`chat_tool`: the tokenizer's own template with one tool; new segments only.

    The segments come from rendering a conversation with placeholders once. A template that is not append-only
    (rendering the tool result rewrites the assistant turn before it: Qwen3 drops an empty <think> block from
    every turn but the last) is handled by `policy` (protocol.template_policy): `append` continues from the
    sampled tokens and appends only the rendered result segment, with a warning that says where the template's
    own rendering of the whole conversation differs; `refuse` makes it a start-up error."""

    _CODE, _RESULT, _TEXT = "RETOOL_PLACEHOLDER_CODE_7f3a", "RETOOL_PLACEHOLDER_RESULT_7f3a", "RETOOL_TEXT_7f3a"

    def __init__(
        self,
        tokenizer: Any,
        system_prompt: str,
        policy: TemplatePolicy = TemplatePolicy.append,
        schemas: list[dict[str, Any]] | None = None,
    ) -> None:
        """`schemas`: the tools' function schemas the template renders (None: the code interpreter's alone)."""
        self.tokenizer = tokenizer
        self.system_prompt = system_prompt
        self.schemas = schemas if schemas is not None else [CODE_INTERPRETER_SCHEMA]
        self.stop_strings = ["</tool_call>"]
        self.policy = policy
        self._call, self._json_code, self._before, self._after = self._probe_template()

    def _messages(self, question: str) -> list[dict[str, Any]]:
        return [{"role": "system", "content": self.system_prompt}, {"role": "user", "content": question}]

    def _render(self, messages: list[dict[str, Any]], add_generation_prompt: bool) -> str:
        return str(
            self.tokenizer.apply_chat_template(
                messages, tools=self.schemas, tokenize=False, add_generation_prompt=add_generation_prompt
            )
        )

    def _probe_template(self) -> tuple[str, bool, str, str]:
        """Render a conversation with placeholders: the model's call text (after its own text), whether the
        code sits in a JSON string, and the text around the result up to the next assistant header."""
        base = self._messages("Q")
        call = {"role": "assistant", "content": self._TEXT, "tool_calls": [tool_call(self._CODE)]}
        prompt = self._render(base, True)
        with_call = self._render([*base, call], False)
        with_result = self._render([*base, call, {"role": "tool", "content": self._RESULT}], True)
        text_at = with_result.find(self._TEXT)
        code_at = with_result.find(self._CODE, text_at)
        end_of_call = with_result.find("</tool_call>", code_at)
        result_at = with_result.find(self._RESULT, end_of_call)
        if min(text_at, code_at, end_of_call, result_at) < 0:
            raise ConfigError(
                "protocol=chat_tool: this tokenizer's chat template does not render a <tool_call> followed by its "
                "tool result (DeepSeek-R1-Distill's template, for one, renders no tool calls); use "
                "protocol=retool_tags with this model, or give a template with tool calls in model.chat_template"
            )
        end_of_call += len("</tool_call>")
        if not (with_call.startswith(prompt) and with_result.startswith(with_call)):
            self._not_append_only(prompt, with_call, with_result)
        segment = with_result[end_of_call:]
        before, _, after = segment.partition(self._RESULT)
        call_text = with_result[text_at + len(self._TEXT) : end_of_call]
        return call_text, f'"{self._CODE}"' in call_text, before, after

    def _not_append_only(self, prompt: str, with_call: str, with_result: str) -> None:
        rewritten = "a tool call's turn" if with_call.startswith(prompt) else "the prompt"
        what = (
            f"rendering the next message rewrites {rewritten} (Qwen3's template, for one, drops the <think> "
            "block of earlier assistant turns)"
        )
        if self.policy is TemplatePolicy.refuse:
            raise ConfigError(
                f"protocol=chat_tool: this tokenizer's chat template is not append-only: {what}, and "
                "protocol.template_policy=refuse; protocol.template_policy=append continues from the sampled tokens "
                "instead, or use protocol=retool_tags"
            )
        if not _warned_once(f"append-only:{rewritten}"):
            logging.getLogger(__name__).warning(
                "protocol=chat_tool: the chat template is not append-only: %s. protocol.template_policy=append: "
                "each trajectory continues from the tokens the model sampled and only the tool-result segment is "
                "rendered, so training sees what the model saw",
                what,
            )

    def prompt_ids(self, question: str) -> list[int]:
        return list(self.tokenizer.encode(self._render(self._messages(question), True), add_special_tokens=False))

    def call_text(self, code: str) -> str:
        """The text with which the model calls the tool after its own text, as the template writes it."""
        escaped = json.dumps(code, ensure_ascii=False)[1:-1] if self._json_code else code
        return self._call.replace(self._CODE, escaped)

    def parse_call(self, turn_text: str) -> ToolCall:
        return parse_chat_call(turn_text, self.schemas)

    def result_ids(self, result_text: str) -> list[int]:
        return list(self.tokenizer.encode(self._before + result_text + self._after, add_special_tokens=False))


_WARNED: set[str] = set()


def _warned_once(key: str) -> bool:
    """Whether this process already gave the warning `key` (a protocol is built by every command, and again)."""
    seen = key in _WARNED
    _WARNED.add(key)
    return seen


def tool_call(code: str) -> dict[str, Any]:
    """An OpenAI-style tool call of the interpreter, as chat messages carry it."""
    return {"type": "function", "function": {"name": INTERPRETER, "arguments": {"code": code}}}


def _template_ids(tokenizer: Any, messages: list[dict[str, Any]], add_generation_prompt: bool) -> list[int]:
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)
    return list(tokenizer.encode(text, add_special_tokens=False))


def build_protocol(
    cfg: ProtocolConfig, tokenizer: Any, schemas: list[dict[str, Any]] | None = None
) -> TaggedProtocol | ChatToolProtocol:
    """The protocol `cfg` names; `schemas`: the tools chat_tool renders (None: the code interpreter). A chat
    template that cannot render the protocol's conversation (a system message, say: Gemma's refuses one) is a
    start-up error that names the fix, not the template's own exception at the first prompt."""
    from jinja2 import TemplateError

    try:
        protocol: TaggedProtocol | ChatToolProtocol
        if cfg.name is ProtocolName.chat_tool:
            protocol = ChatToolProtocol(tokenizer, cfg.chat_tool_system_prompt, cfg.template_policy, schemas)
        elif cfg.name is ProtocolName.none:
            protocol = TaggedProtocol(tokenizer, cfg.text_only_system_prompt, use_tool=False)
        else:
            protocol = TaggedProtocol(tokenizer, cfg.system_prompt)
        protocol.prompt_ids("What is 1 + 1?")  # the system prompt and a question, as every rollout renders them
    except TemplateError as exc:
        raise ConfigError(
            f"protocol={cfg.name.value}: the chat template cannot render the protocol's conversation ({exc}); "
            "give a template that can with model.chat_template=FILE.jinja"
        ) from None
    return protocol


def overlong_prompts(protocol: TaggedProtocol | ChatToolProtocol, examples: list[Any], max_tokens: int) -> list[Any]:
    """The examples whose templated prompt is longer than `max_tokens` (rollout.max_prompt_tokens)."""
    return [ex for ex in examples if len(protocol.prompt_ids(ex.question)) > max_tokens]


def drop_overlong_prompts(
    examples: list[Any], protocol: TaggedProtocol | ChatToolProtocol, max_tokens: int
) -> list[Any]:
    """Training questions whose prompt fits rollout.max_prompt_tokens (verl's filter_overlong_prompts), the
    others dropped with a logged count; none left is an error."""
    overlong = {ex.id for ex in overlong_prompts(protocol, examples, max_tokens)}
    if overlong:
        logging.getLogger(__name__).warning(
            "dropped %d of %d training questions whose prompt is longer than rollout.max_prompt_tokens=%d",
            len(overlong),
            len(examples),
            max_tokens,
        )
        if len(overlong) == len(examples):
            raise DataError(f"every training question's prompt is longer than rollout.max_prompt_tokens={max_tokens}")
    return [ex for ex in examples if ex.id not in overlong]
