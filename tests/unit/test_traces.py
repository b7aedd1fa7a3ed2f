"""SFT traces: rendered with the RL protocol, loss only on the model's own tokens."""

from __future__ import annotations

import json

import pytest
from transformers import AutoTokenizer

from retool_cli.config import Isolation, SandboxConfig, SyntheticConfig
from retool_cli.data.dataset import MathExample
from retool_cli.data.synthetic import KINDS, generate
from retool_cli.data.traces import dump_messages, file_traces, synthetic_traces
from retool_cli.env.protocol import TaggedProtocol
from retool_cli.env.sandbox import Sandbox
from retool_cli.errors import DataError
from retool_cli.model.tiny import tiny_model_path


@pytest.fixture(scope="module")
def protocol():
    return TaggedProtocol(AutoTokenizer.from_pretrained(tiny_model_path()), "SYS")


def examples(n: int) -> list[MathExample]:
    cfg = SyntheticConfig(num_examples=n, kinds=list(KINDS))
    return [MathExample(i, q, a, "synthetic", code) for i, q, a, code in generate(cfg, 0)]


def test_solution_code_prints_the_answer_in_the_sandbox() -> None:
    rows = examples(18)  # two of every kind
    with Sandbox(SandboxConfig(isolation=Isolation.auto, workers=2)) as sandbox:
        results = sandbox.run_many([e.solution_code for e in rows])
    assert [r.stdout.strip() for r in results] == [e.answer for e in rows]


def test_synthetic_traces_mix_and_masks(protocol) -> None:
    tokenizer = protocol.tokenizer
    rows = examples(200)
    traces = synthetic_traces(rows, protocol, code_fraction=0.5, seed=0)
    coded = [t for t in traces if 0 in t.response_mask]
    assert 70 < len(coded) < 130  # about half call the interpreter
    for trace, example in zip(traces, rows, strict=True):
        assert trace.prompt_ids == protocol.prompt_ids(example.question)
        text = tokenizer.decode(trace.response_ids)
        assert text.endswith(f"\\boxed{{{example.answer}}}.{tokenizer.eos_token}")
        trained = tokenizer.decode([i for i, m in zip(trace.response_ids, trace.response_mask, strict=True) if m])
        masked = tokenizer.decode([i for i, m in zip(trace.response_ids, trace.response_mask, strict=True) if not m])
        if 0 in trace.response_mask:
            assert masked == f"\n<interpreter>\n{example.answer}\n</interpreter>\n"  # the tool output is not trained
            assert "<code>" in trained and "<interpreter>" not in trained
        else:
            assert masked == "" and trained == text
    assert synthetic_traces(rows, protocol, 0.5, seed=0)[5].response_ids == traces[5].response_ids


def test_synthetic_traces_refuse_problems_without_a_program(protocol) -> None:
    rows = examples(3)
    rows[1] = MathExample("dapo-7", "What is 2 + 2?", "4", "dapo")
    with pytest.raises(DataError, match=r"1 training problems \(first: 'dapo-7'\).*sft.traces_file"):
        synthetic_traces(rows, protocol, 0.5, seed=0)


def test_message_traces(protocol, tmp_path) -> None:
    path = tmp_path / "sft.jsonl"
    dump_messages(
        path, "What is 2+2?", [("model", "Add."), ("call", "print(2+2)"), ("tool", "4"), ("model", "\\boxed{4}")]
    )
    [trace] = file_traces(str(path), protocol)
    tokenizer = protocol.tokenizer
    assert tokenizer.decode(trace.response_ids) == (
        "Add.\n<code>\n```python\nprint(2+2)\n```\n</code>\n<interpreter>\n4\n</interpreter>\n\\boxed{4}"
        + tokenizer.eos_token
    )
    assert sum(trace.response_mask) < len(trace.response_mask)
    path.write_text(path.read_text() + json.dumps({"messages": [{"role": "user", "content": "q"}]}) + "\n")
    with pytest.raises(DataError, match=r"sft.jsonl:2: needs a user message and must end with an assistant message"):
        file_traces(str(path), protocol)
