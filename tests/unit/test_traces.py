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
from tests.helpers import write_jsonl


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


# ------------------------------------------------------------------ ReTool-SFT and tool-call messages, real tokenizers

RETOOL_PROMPT = (
    "Solve the following problem step by step. You now have the ability to selectively write executable Python "
    "code to enhance your reasoning process. The outputs (wrapped in `<interpreter>output_str</interpreter>`) can "
    "be returned to aid your reasoning. Each code snippet is wrapped with `<code>\n```python\ncode snippet\n```\n"
    "</code>`.\nThe last part of your response should be in the following format:\n<answer>\n\\boxed{'The final "
    "answer goes here.'}\n</answer>\n\n*user question:*\n{question}\n\nRemember to place the final answer in the "
    "last part using the format: \n<answer>\n\\boxed{'The final answer goes here.'}\n</answer>"
)
# (question, [(model text, code, interpreter output)...], final text): the shape of JoeYing/ReTool-SFT's rows
RETOOL_ROWS = [
    (
        "What is $2^{10} + 3^5$?",
        [
            ("I will compute both powers.\n", "print(2**10 + 3**5)", "1267"),
            ("Check it another way.\n", "x = 1024\nprint(x + 243)", "1267"),
        ],
        "Both agree.\n<answer>\n\\boxed{1267}\n</answer>",
    ),
    (
        "How many primes are below 30?",
        [("", "from sympy import primepi\nprint(primepi(29))", "10")],
        "<answer>\\boxed{10}</answer>",
    ),
]


def retool_sft_rows() -> list[dict]:
    rows = []
    for question, steps, final in RETOOL_ROWS:
        response = "".join(
            f"{text}<code>\n```python\n{code}\n```\n</code>\n<interpreter>\n{out}\n</interpreter>\n"
            for text, code, out in steps
        )
        user = RETOOL_PROMPT.replace("{question}", question)
        rows.append(
            {"messages": [{"role": "user", "content": user}, {"role": "assistant", "content": response + final}]}
        )
    return rows


def verl_converted_rows() -> list[dict]:
    """The same traces as chat messages with tool calls (the shape verl's ReTool recipe converts them to)."""
    rows = []
    for question, steps, final in RETOOL_ROWS:
        messages = [{"role": "user", "content": question}]
        for text, code, out in steps:
            call = {
                "type": "function",
                "function": {"name": "code_interpreter", "arguments": json.dumps({"code": code})},
            }
            messages += [{"role": "assistant", "content": text, "tool_calls": [call]}, {"role": "tool", "content": out}]
        rows.append({"messages": [*messages, {"role": "assistant", "content": final}]})
    return rows


@pytest.fixture(scope="module")
def retool_parquet(tmp_path_factory):
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path_factory.mktemp("retool_sft") / "train_2000.parquet"
    pq.write_table(pa.Table.from_pylist(retool_sft_rows()), path)
    return path


@pytest.mark.parametrize("protocol_name", ["retool_tags", "chat_tool"])
def test_retool_sft_parquet_renders_with_the_runs_protocol(retool_parquet, tmp_path, protocol_name) -> None:
    from retool_cli.config import ProtocolConfig, ProtocolName
    from retool_cli.env.protocol import build_protocol
    from tests.real_models import load_real_tokenizer

    tokenizer = load_real_tokenizer("qwen2.5-instruct")
    protocol = build_protocol(ProtocolConfig(name=ProtocolName(protocol_name)), tokenizer)
    traces = file_traces(str(retool_parquet), protocol)
    assert len(traces) == 2
    for trace, (question, steps, final) in zip(traces, RETOOL_ROWS, strict=True):
        # the question alone, under the run's own system prompt: the instructions RL samples with
        assert trace.prompt_ids == protocol.prompt_ids(question)
        response, mask = trace.response_ids, trace.response_mask
        masked = tokenizer.decode([t for t, m in zip(response, mask, strict=True) if not m])
        trained = tokenizer.decode([t for t, m in zip(response, mask, strict=True) if m])
        expected_masked = "".join(tokenizer.decode(protocol.result_ids(out)) for _, _, out in steps)
        assert masked == expected_masked  # the interpreter's text, as the loop renders it, masked
        expected_trained = "".join(text.rstrip("\n") + protocol.call_text(code) for text, code, _ in steps)
        assert trained == expected_trained + final + tokenizer.eos_token
        assert all(
            protocol.parse_call(text.rstrip("\n") + protocol.call_text(code)).arguments == {"code": code}
            for text, code, _ in steps
        )
    if protocol_name == "retool_tags":  # the tagged response is kept as ReTool-SFT writes it
        text = tokenizer.decode(traces[0].response_ids)
        assert text == retool_sft_rows()[0]["messages"][1]["content"] + tokenizer.eos_token
    # chat messages with tool calls (verl's conversion of the same data) give the same traces
    converted = write_jsonl(tmp_path / "converted.jsonl", verl_converted_rows())
    assert [t.input_ids for t in file_traces(str(converted), protocol)] == [t.input_ids for t in traces]


def test_bad_trace_rows_name_the_row(tmp_path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = retool_sft_rows()
    response = rows[1]["messages"][1]["content"]
    rows[1]["messages"][1]["content"] = response.replace("<interpreter>\n10\n</interpreter>\n", "")  # no output
    path = tmp_path / "bad.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    protocol = TaggedProtocol(AutoTokenizer.from_pretrained(tiny_model_path()), "SYS")
    with pytest.raises(DataError, match=r"bad.parquet row 1: a <code> block without an <interpreter> result"):
        file_traces(str(path), protocol)
    with pytest.raises(DataError, match=r"sft.traces_file=nowhere/x.jsonl: no such file"):
        file_traces("nowhere/x.jsonl", protocol)
    # a hub id offline: the key that takes a local copy is named
    with pytest.raises(DataError, match=r"JoeYing/ReTool-SFT.*Pass a local copy with sft.traces_file="):
        file_traces("JoeYing/ReTool-SFT", protocol, revision="d6e5a4e")


def test_a_datasets_folder_of_traces_reads_as_the_file_does(retool_parquet, tmp_path) -> None:
    """A hub dataset arrives as a `datasets` object: the same rows saved with save_to_disk read the same."""
    import datasets

    folder = tmp_path / "retool_sft_saved"
    datasets.Dataset.from_parquet(str(retool_parquet)).save_to_disk(str(folder))
    protocol = TaggedProtocol(AutoTokenizer.from_pretrained(tiny_model_path()), "SYS")
    from_folder = [t.input_ids for t in file_traces(str(folder), protocol)]
    assert from_folder == [t.input_ids for t in file_traces(str(retool_parquet), protocol)] and len(from_folder) == 2
