"""Every run folder says what it was made of; eval records the file it actually read."""

from __future__ import annotations

import json
import re
from pathlib import Path

from retool_cli.config import DataConfig, DataSource
from retool_cli.files import sha256_file
from retool_cli.provenance import data_record, file_record
from tests.helpers import run_retool, write_jsonl


def test_eval_records_the_local_file_it_read_and_the_run_its_provenance(tmp_path: Path) -> None:
    rows = [{"id": 60 + i, "problem": f"What is {i} * 7?", "answer": f"{7 * i:03d}"} for i in range(2)]
    path = write_jsonl(tmp_path / "aime_2024.jsonl", rows)
    run_retool(
        "eval",
        "benchmark=aime24",
        f"benchmark.data.path={path}",
        "benchmark.n_samples=1",
        "benchmark.max_response_tokens=32",
        "model.name_or_path=tiny",
        "eval.bootstrap=200",
        "seed=3",
        "hydra.run.dir=run",
        cwd=tmp_path,
        check=True,
    )
    read = json.loads((tmp_path / "run" / "results.json").read_text())["protocol"]["data"]
    assert read == {"source": "aime24", "path": str(path.resolve()), "sha256": sha256_file(path)}
    assert "hub_id" not in read  # the hub id of the benchmark option was not what was read

    record = json.loads((tmp_path / "run" / "provenance.json").read_text())
    assert record["command_line"].startswith("retool eval benchmark=aime24") and "seed=3" in record["overrides"]
    assert record["seed"] == 3 and record["versions"]["torch"] and record["versions"]["retool"]
    assert re.fullmatch(r"[0-9a-f]{40}", record["git"]["commit"]) and isinstance(record["git"]["dirty"], bool)
    assert record["data"]["benchmark.data"]["sha256"] == sha256_file(path)
    assert set(record["data"]) == {"benchmark.data"}  # what eval read, not the unused `data` section


def test_train_file_and_its_manifest_are_hashed(tmp_path: Path) -> None:
    run_retool(
        "prepare",
        "recipe=dapo_smoke",
        "data.synthetic.num_examples=30",
        "data.dev_size=5",
        "hydra.run.dir=prep",
        cwd=tmp_path,
        check=True,
    )
    assert json.loads((tmp_path / "prep" / "provenance.json").read_text())["data"]["data"]["generated"]
    train_file = tmp_path / "prep" / "train.jsonl"
    run_retool(
        "sft",
        "recipe=dapo_smoke",
        f"trainer.train_file={train_file}",
        "sft.steps=1",
        "sft.batch_size=2",
        "hydra.run.dir=sft",
        cwd=tmp_path,
        check=True,
    )
    data = json.loads((tmp_path / "sft" / "provenance.json").read_text())["data"]
    assert set(data) == {"trainer.train_file", "trainer.train_file manifest"}
    assert data["trainer.train_file"]["sha256"] == sha256_file(train_file)
    assert data["trainer.train_file manifest"]["sha256"] == sha256_file(tmp_path / "prep" / "manifest.json")
    folder = file_record(str(tmp_path / "prep"))
    assert len(folder["sha256"]) == 64 and file_record(str(tmp_path / "nothing"))["missing"]


def test_a_hub_source_records_id_revision_and_what_it_resolves_to(monkeypatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    record = data_record(DataConfig(source=DataSource.aime24, hub_id="HuggingFaceH4/aime_2024", revision="abc"))
    assert record["hub_id"] == "HuggingFaceH4/aime_2024" and record["revision"] == "abc"
    assert record["resolved_revision"] is None  # offline: nothing to resolve, and said so
