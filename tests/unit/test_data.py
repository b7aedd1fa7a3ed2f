"""data/dataset.py: strict loading, template stripping, cleaning, dedupe, splits, batches, source readers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from retool_cli.config import ColumnsConfig, DataConfig, DataSource
from retool_cli.data.dataset import (
    DAPO_PREFIX,
    DAPO_SUFFIX,
    MathExample,
    PrepareStats,
    RawRow,
    clean_text,
    dedupe,
    load_jsonl,
    normalize_question,
    prepare_dataset,
    shuffled_examples,
    split_dev,
    strip_dapo_template,
    take_batch,
    to_examples,
)
from retool_cli.errors import DataError
from tests.helpers import write_jsonl


def ex(i: int, question: str | None = None, answer: str = "1") -> MathExample:
    return MathExample(f"id{i}", question or f"question {i}", answer, "test")


def row(i: int, **overrides) -> dict:
    return {"id": f"id{i}", "question": f"q{i}", "answer": str(i), "data_source": "t", **overrides}


# ------------------------------------------------------------------ strict JSONL


def test_load_jsonl_roundtrip_and_numeric_answer(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "a.jsonl", [row(1), "", row(2, answer=7)])
    examples = load_jsonl(path)
    assert examples == [MathExample("id1", "q1", "1", "t"), MathExample("id2", "q2", "7", "t")]
    with pytest.raises(AttributeError):
        examples[0].answer = "2"  # frozen


@pytest.mark.parametrize(
    ("bad_line", "message"),
    [
        ('{"id": "x", "question": "q"', "malformed JSON"),
        ("[1, 2]", "expected a JSON object"),
        (json.dumps({"id": "x", "question": "q", "data_source": "t"}), "field 'answer' is missing"),
        (
            json.dumps({"id": "x", "question": "  ", "answer": "1", "data_source": "t"}),
            "field 'question' is empty",
        ),
        (json.dumps(row(1)), "duplicate id 'id1' (first seen on line 1)"),
    ],
)
def test_load_jsonl_errors_name_file_and_line(tmp_path: Path, bad_line: str, message: str) -> None:
    path = write_jsonl(tmp_path / "bad.jsonl", [row(1), row(2), bad_line])
    with pytest.raises(DataError) as info:
        load_jsonl(path)
    assert f"{path}:3" in str(info.value)
    assert message in str(info.value)


def test_load_jsonl_missing_file(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="no such file"):
        load_jsonl(tmp_path / "nope.jsonl")


def test_shuffled_examples_is_seeded(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "a.jsonl", [row(i) for i in range(50)])
    first, again, other = (shuffled_examples(path, s) for s in (3, 3, 4))
    assert first == again
    assert first != other
    assert sorted(e.id for e in first) == sorted(e.id for e in other)


def test_take_batch_cycles_with_modulo() -> None:
    examples = [ex(i) for i in range(5)]
    assert [e.id for e in take_batch(examples, 0, 3)] == ["id0", "id1", "id2"]
    assert [e.id for e in take_batch(examples, 3, 3)] == ["id3", "id4", "id0"]
    assert [e.id for e in take_batch(examples, 12, 7)] == ["id2", "id3", "id4", "id0", "id1", "id2", "id3"]
    with pytest.raises(DataError, match="empty"):
        take_batch([], 0, 1)
    with pytest.raises(DataError, match="size must be positive"):
        take_batch(examples, 0, 0)


# ------------------------------------------------------------------ cleaning


def test_strip_dapo_template_only_touches_templated_questions() -> None:
    question = "Find $x$ if $2x = 4$."
    assert strip_dapo_template(DAPO_PREFIX + question + DAPO_SUFFIX) == question
    assert strip_dapo_template(question) == question
    # a question that merely mentions "Answer:" keeps its text
    odd = 'Write "Answer:" then the number. What is 2+2?'
    assert strip_dapo_template(odd) == odd


def test_clean_text_repairs_unescaped_latex_control_chars() -> None:
    text, repaired = clean_text("  The answer is in the form \x0crac{m}{n}.\r\n")
    assert repaired
    assert text == "The answer is in the form \\frac{m}{n}."
    assert clean_text("plain") == ("plain", False)


def test_normalize_question_ignores_case_and_whitespace() -> None:
    assert normalize_question("What  is\n2+2?") == normalize_question("what is 2+2? ")
    assert normalize_question("What is 2+3?") != normalize_question("What is 2+2?")


# ------------------------------------------------------------------ dedupe and split


def test_dedupe_keeps_first_copy_and_drops_conflicting_answers() -> None:
    examples = [
        ex(1, "What is 2+2?", "4"),
        ex(2, "what is  2+2?", "4"),  # duplicate, same answer
        ex(3, "Name x.", "5"),
        ex(4, "Name  X.", "6"),  # same question, other answer: both copies go
        ex(5, "Another one.", "1"),
        ex(6, "What is 2+2?", " $4$ "),  # same answer after normalisation
    ]
    stats = PrepareStats()
    kept = dedupe(examples, stats)
    assert [e.id for e in kept] == ["id1", "id5"]
    assert stats.dropped == {"duplicate_question": 2, "conflicting_answers": 2}


def test_dedupe_makes_ids_unique() -> None:
    kept = dedupe([MathExample("a", "q1", "1", "s"), MathExample("a", "q2", "2", "s")], PrepareStats())
    assert [e.id for e in kept] == ["a", "a#2"]


def test_split_dev_is_deterministic_and_disjoint() -> None:
    examples = [ex(i) for i in range(100)]
    train, dev = split_dev(examples, 10, seed=7)
    assert (train, dev) == split_dev(examples, 10, seed=7)
    assert dev != split_dev(examples, 10, seed=8)[1]
    assert len(dev) == 10 and len(train) == 90
    assert {e.id for e in train} | {e.id for e in dev} == {e.id for e in examples}
    assert not {e.id for e in train} & {e.id for e in dev}
    assert train == sorted(train, key=lambda e: int(e.id[2:]))  # input order kept
    with pytest.raises(DataError, match="leaves no training examples"):
        split_dev(examples, 100, seed=0)


# ------------------------------------------------------------------ source rows


def dapo_row(index: int, question: str, answer: str) -> dict:
    return {
        "data_source": "math_dapo",
        "prompt": [{"content": DAPO_PREFIX + question + DAPO_SUFFIX, "role": "user"}],
        "ability": "MATH",
        "reward_model": {"ground_truth": answer, "style": "rule-lang"},
        "extra_info": {"index": f"uuid-{index}"},
    }


DAPO_COLUMNS = ColumnsConfig(question="prompt", answer="reward_model.ground_truth", id="extra_info.index")


def test_to_examples_reads_dapo_layout() -> None:
    cfg = DataConfig(source=DataSource.dapo_math_17k, name="dapo", columns=DAPO_COLUMNS, strip_dapo_template=True)
    stats = PrepareStats()
    rows = [RawRow(f"r{i}", dapo_row(i, f"Problem {i}?", str(i))) for i in range(3)]
    rows.append(RawRow("r3", {**dapo_row(3, "", "1")}))
    examples = to_examples(rows, cfg, stats)
    assert examples == [MathExample(f"uuid-{i}", f"Problem {i}?", str(i), "dapo") for i in range(3)]
    assert stats.read == 4
    assert stats.dropped == {"empty_question_or_answer": 1}
    assert stats.repaired["dapo_template_stripped"] == 4


def test_to_examples_missing_column_names_row_and_column() -> None:
    cfg = DataConfig(source=DataSource.file, path="x", columns=ColumnsConfig(question="problem", answer="solution"))
    with pytest.raises(DataError, match=r"f.jsonl:2: column 'solution' not found \(row has: answer, problem\)"):
        to_examples([RawRow("f.jsonl:2", {"problem": "p", "answer": "1"})], cfg, PrepareStats())


def test_prepare_dataset_local_dapo_copy(tmp_path: Path) -> None:
    """The hub layout read through `datasets` from a local folder (what a downloaded copy looks like)."""
    import datasets

    rows = [dapo_row(i, f"Problem {i % 5}?", str(i % 5)) for i in range(20)]  # 5 problems x 4 copies
    rows.append(dapo_row(99, "Problem 0?", "wrong"))  # a copy disagreeing on the answer
    datasets.Dataset.from_list(rows).save_to_disk(str(tmp_path / "dapo"))
    cfg = DataConfig(
        source=DataSource.dapo_math_17k,
        name="dapo",
        path=str(tmp_path / "dapo"),
        columns=DAPO_COLUMNS,
        strip_dapo_template=True,
        dev_size=1,
    )
    train, dev, stats = prepare_dataset(cfg, seed=0)
    assert stats.read == 21
    assert stats.dropped == {"conflicting_answers": 5, "duplicate_question": 12}
    assert len(train) == 3 and len(dev) == 1
    assert {e.question for e in train + dev} == {"Problem 1?", "Problem 2?", "Problem 3?", "Problem 4?"}


def test_prepare_dataset_hub_path_on_local_repo(tmp_path: Path) -> None:
    """`read_hub_rows` calls datasets.load_dataset(hub_id, revision, split); a local repo folder in
    the hub's parquet layout stands in for the hub (no network here)."""
    import datasets

    repo = tmp_path / "repo"
    (repo / "data").mkdir(parents=True)
    rows = [{"id": 60 + i, "problem": f"AIME problem {i}", "answer": f"{i:03d}", "url": "u"} for i in range(4)]
    datasets.Dataset.from_list(rows).to_parquet(str(repo / "data" / "train-00000-of-00001.parquet"))
    cfg = DataConfig(source=DataSource.aime24, name="aime24", hub_id=str(repo), columns=ColumnsConfig(id="id"))
    train, dev, _ = prepare_dataset(cfg, seed=0)
    assert [(e.id, e.answer) for e in train] == [("60", "000"), ("61", "001"), ("62", "002"), ("63", "003")]
    assert dev == []


def test_hub_error_says_how_to_work_offline(tmp_path: Path) -> None:
    cfg = DataConfig(source=DataSource.aime24, hub_id=str(tmp_path / "missing-repo"))
    with pytest.raises(DataError, match="data.path=FILE_OR_FOLDER"):
        prepare_dataset(cfg, seed=0)


def test_parquet_and_json_files(tmp_path: Path) -> None:
    import datasets

    rows = [{"q": f"question {i}", "a": i} for i in range(3)]
    datasets.Dataset.from_list(rows).to_parquet(str(tmp_path / "x.parquet"))
    (tmp_path / "x.json").write_text(json.dumps({"data": rows}))
    for name in ("x.parquet", "x.json"):
        cfg = DataConfig(source=DataSource.file, name="f", path=str(tmp_path / name), columns=ColumnsConfig("q", "a"))
        train, _, _ = prepare_dataset(cfg, seed=0)
        assert [(e.id, e.question, e.answer) for e in train] == [(f"f-{i}", f"question {i}", str(i)) for i in range(3)]
