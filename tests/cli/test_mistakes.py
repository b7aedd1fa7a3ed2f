"""One test per kind of mistake a user makes, on the real command line: exit status 1, one message naming the key
or file (and line), no traceback, and no run folder left behind. The cases are of each kind, not a list of
known ones: the checks they exercise are general (every data read, every model folder, every config key)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from retool_cli.checkpoint_paths import record_of, write_record
from retool_cli.config import RetoolConfig
from retool_cli.env.sandbox import bwrap_usable
from tests.helpers import run_retool, write_jsonl

SMOKE = ["recipe=dapo_smoke", "data.synthetic.num_examples=40", "data.dev_size=4"]
ROW = {"problem": "What is 1+1?", "answer": "2"}


def latin1_file(tmp: Path) -> str:
    path = write_jsonl(tmp / "mixed.jsonl", [ROW, {**ROW, "answer": "3"}])
    with open(path, "ab") as handle:
        handle.write(b'{"problem": "Combien co\xfbte 3 \xb0C ?", "answer": "3"}\n')
    return str(path)


def corrupt_parquet(tmp: Path) -> str:
    path = tmp / "traces.parquet"
    path.write_bytes(b"PAR1" + os.urandom(300))  # the magic number, then garbage: a copy gone wrong
    return str(path)


def tiny_folder(tmp: Path) -> Path:
    from retool_cli.model.tiny import tiny_model_path

    folder = tmp / "checkpoints" / "step_7"
    shutil.copytree(tiny_model_path(), folder)
    return folder


def cut_short_checkpoint(tmp: Path) -> str:
    folder = tiny_folder(tmp)
    write_record(folder, {"step": 7, **record_of(RetoolConfig(command="sft"))})
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:4096])
    return str(folder)


def no_tokenizer_files(tmp: Path) -> str:
    folder = tiny_folder(tmp)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json"):
        (folder / name).unlink(missing_ok=True)
    return str(folder)


def malformed_recipe(tmp: Path) -> str:
    (tmp / "conf" / "recipe").mkdir(parents=True)
    (tmp / "conf" / "recipe" / "mine.yaml").write_text("trainer:\n  lr: 1e-5\n\tquestions_per_step: 4\n")
    return str(tmp / "conf")


def unreadable_reference(tmp: Path) -> str:
    rows = [
        ROW,
        {"problem": "Which shape has four equal sides?", "answer": "\\text{}"},
        {"problem": "2+1?", "answer": "3"},
    ]
    return str(write_jsonl(tmp / "shapes.jsonl", rows))


CASES: dict[str, tuple[str, Callable[[Path], list[str]], str]] = {
    # kind: (command, arguments given a scratch folder, what the message must say)
    "non-UTF-8 data": ("prepare", lambda t: ["data=file", f"data.path={latin1_file(t)}"], "mixed.jsonl:3: not UTF-8"),
    "damaged parquet": (
        "sft",
        lambda t: [f"sft.traces_file={corrupt_parquet(t)}"],
        "traces.parquet: not a readable parquet",
    ),
    "missing model folder": (
        "eval",
        lambda t: ["model.name_or_path=../models/qwen-sft"],
        "model.name_or_path=../models/qwen-sft: no such folder",
    ),
    "run folder as a model": (
        "sft",
        lambda t: [f"model.name_or_path={tiny_folder(t).parents[1]}"],
        "pass it as trainer.init_from or ckpt",
    ),
    "cut-short checkpoint": ("eval", lambda t: [f"ckpt={cut_short_checkpoint(t)}"], "model.safetensors has 4096 bytes"),
    "cut-short init_from": ("train", lambda t: [f"trainer.init_from={cut_short_checkpoint(t)}"], "trainer.init_from="),
    "checkpoint without tokenizer": ("eval", lambda t: [f"ckpt={no_tokenizer_files(t)}"], "no tokenizer files"),
    "malformed recipe": ("train", lambda t: ["--config-dir", malformed_recipe(t), "recipe=mine"], "mine.yaml:3:"),
    "unknown key": (
        "train",
        lambda t: ["+rollout.samples_per_prompt=4"],
        "rollout.samples_per_prompt: not a config key",
    ),
    "learns nothing": ("train", lambda t: ["rollout.group_size=1"], "rollout.group_size: 1"),
    "negative value": ("sft", lambda t: ["sft.warmup_steps=-5"], "sft.warmup_steps: must be >= 0"),
    "unreadable reference": (
        "prepare",
        lambda t: ["data=file", f"data.path={unreadable_reference(t)}", "data.dev_size=0"],
        "1 of 3 examples have a reference answer the judge cannot match",
    ),
    "zero shards": ("filter-pass-rate", lambda t: ["shard.count=0"], "shard.count: must be >= 1"),
}


@pytest.mark.parametrize("kind", list(CASES))
def test_each_kind_of_mistake_is_one_clear_line_and_leaves_nothing(kind: str, tmp_path: Path) -> None:
    command, arguments, says = CASES[kind]
    proc = run_retool(command, *SMOKE, *arguments(tmp_path), "hydra.run.dir=run", cwd=tmp_path)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert says in " ".join(out.split()), out  # (the log wraps long lines)
    assert "Traceback" not in out and "Error executing job" not in out, out
    assert not (tmp_path / "run").exists() and not (tmp_path / "outputs").exists()


BWRAP_OK, BWRAP_WHY = bwrap_usable()


def in_jail(mount: list[str], shell: str, cwd: Path) -> subprocess.CompletedProcess:
    """`shell` with the whole file system as it is except `mount` (bubblewrap: a read-only or a tiny folder)."""
    jail = ["bwrap", "--bind", "/", "/", "--dev", "/dev", "--proc", "/proc", *mount, "sh", "-c", shell]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "COLUMNS": "200"}
    return subprocess.run(jail, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.skipif(not BWRAP_OK, reason=f"needs bubblewrap to mount a read-only or a full folder: {BWRAP_WHY}")
def test_a_read_only_or_full_disk_says_so(tmp_path: Path) -> None:
    retool = f"{sys.executable} -m retool_cli prepare recipe=dapo_smoke"  # 2000 problems: 380 KB written
    (tmp_path / "ro").mkdir()
    proc = in_jail(
        ["--ro-bind", str(tmp_path / "ro"), str(tmp_path / "ro")], f"{retool} hydra.run.dir=ro/run", tmp_path
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1 and "hydra.run.dir=ro/run" in out and "read-only file system" in out, out
    assert "Traceback" not in out
    (tmp_path / "small").mkdir()  # 48 KiB: Hydra's files fit, the prepared data does not
    shell = f"{retool} hydra.run.dir=small/run; echo exit=$?; ls -A small"
    proc = in_jail(["--size", str(48 << 10), "--tmpfs", str(tmp_path / "small")], shell, tmp_path)
    out = " ".join((proc.stdout + proc.stderr).split())
    assert "No space left on device" in out and "exit=1" in out and "Traceback" not in out, out
    assert out.rstrip().endswith("exit=1"), out  # and nothing left in the folder


@pytest.mark.skipif(not BWRAP_OK, reason=f"needs bubblewrap to mount a full folder: {BWRAP_WHY}")
def test_a_run_the_disk_fills_under_says_the_command_that_resumes_it(tmp_path: Path) -> None:
    """A training run with resume off whose disk fills up at its first checkpoint (its first step's metrics
    written): the full disk named, and the command that resumes the run, resume turned on (the same command
    would start over, removing what the run wrote)."""
    retool = f"{sys.executable} -m retool_cli train {' '.join(SMOKE)} model.name_or_path=tiny"
    retool += " trainer.total_steps=2 trainer.save_every=1 trainer.questions_per_step=2 rollout.group_size=2"
    retool += " rollout.max_response_tokens=16 trainer.resume=false"
    (tmp_path / "small").mkdir()  # 256 KiB: the run's logs and metrics fit, a checkpoint (~2 MB) does not
    shell = f"{retool} hydra.run.dir=small/run; echo exit=$?; ls -A small/run"
    proc = in_jail(["--size", str(256 << 10), "--tmpfs", str(tmp_path / "small")], shell, tmp_path)
    out = " ".join((proc.stdout + proc.stderr).split())
    assert "No space left on device" in out and "exit=1" in out and "Traceback" not in out, out
    assert "metrics.jsonl" in out.split("exit=1")[1], out  # kept: what the run wrote before
    [line] = re.findall(r"to resume, run: retool (train .*?hydra\.run\.dir=\S+)", out)
    assert "trainer.resume=true" in line.split() and "trainer.resume=false" not in line.split(), line


def test_eval_counts_references_no_answer_can_match(tmp_path: Path) -> None:
    """Kept on purpose (or from a benchmark file): eval says how many problems score 0 whatever the answer."""
    benchmark = unreadable_reference(tmp_path)
    args = ["benchmark=file", f"benchmark.data.path={benchmark}", "benchmark.n_samples=1"]
    proc = run_retool("eval", *SMOKE, *args, "benchmark.max_response_tokens=16", "hydra.run.dir=ev", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "1 of 3 problems have a reference answer the judge cannot match" in " ".join(
        (proc.stdout + proc.stderr).split()
    )
    results = json.loads((tmp_path / "ev" / "results.json").read_text())
    assert results["metrics"]["unreadable_references"] == 1


def test_a_train_file_is_all_train_reads_without_periodic_evals(tmp_path: Path) -> None:
    """trainer.train_file decides what is loaded: a `data` section that cannot load (here a missing file; offline,
    a hub dataset) is not touched unless periodic evals need a dev split and none lies beside the file."""
    from retool_cli.config import DataConfig, DataSource, TrainerConfig
    from retool_cli.data.dataset import training_examples
    from retool_cli.errors import DataError

    rows = [{"id": f"q{i}", "question": f"What is {i}+1?", "answer": str(i + 1), "data_source": "x"} for i in range(5)]
    (tmp_path / "prep").mkdir()
    train_file = str(write_jsonl(tmp_path / "prep" / "train.jsonl", rows))
    unloadable = DataConfig(source=DataSource.file, path=str(tmp_path / "nowhere.jsonl"))
    config = RetoolConfig(command="train", data=unloadable, trainer=TrainerConfig(train_file=train_file))
    examples, dev = training_examples(config)
    assert sorted(e.id for e in examples) == [f"q{i}" for i in range(5)] and dev == []
    evals = RetoolConfig(command="train", data=unloadable, trainer=TrainerConfig(train_file=train_file, eval_every=5))
    with pytest.raises(DataError, match="nowhere.jsonl"):
        training_examples(evals)  # no dev.jsonl beside: the data section's dev split is needed
    write_jsonl(tmp_path / "prep" / "dev.jsonl", rows[:2])
    assert [e.id for e in training_examples(evals)[1]] == ["q0", "q1"]


def test_a_damaged_filter_shard_is_named_by_file_and_line(tmp_path: Path) -> None:
    shard = tmp_path / "shard_0"
    shard.mkdir()
    rows = [{"id": f"p{i}", "question": f"{i}+1?", "answer": str(i + 1), "data_source": "x"} for i in range(2)]
    write_jsonl(shard / "problems.jsonl", rows)
    (shard / "pass_rates.jsonl").write_text(
        '{"problem_id": "p0", "position": 0, "pass_rate": 0.5}\n{"problem_id": "p1", "pos\n'
    )
    proc = run_retool("filter-merge", str(shard), "--out", "merged", cwd=tmp_path)
    out = " ".join((proc.stdout + proc.stderr).split())
    assert proc.returncode == 1 and "pass_rates.jsonl:2: malformed JSON" in out and "Traceback" not in out, out
    assert not (tmp_path / "merged").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="a machine without CUDA is the case")
def test_a_cuda_recipe_on_a_machine_without_cuda_is_refused_once_before_any_process_starts(tmp_path: Path) -> None:
    """The 7B recipe asks for 8 processes on CUDA: one line from the launcher, no torchrun, no run folder."""
    proc = run_retool("train", "recipe=retool_qwen2.5_7b", "hydra.run.dir=run", cwd=tmp_path, timeout=120)
    out = " ".join((proc.stdout + proc.stderr).split())
    assert proc.returncode == 1 and out.count("model.device=cuda but CUDA is not available") == 1, out
    assert "torchrun" not in out and "Traceback" not in out and not (tmp_path / "run").exists()


def test_train_names_an_overlap_key_that_does_nothing_before_it_starts(tmp_path: Path) -> None:
    """rollout.engine_processes on a colocated run: a note naming the key, logged before the run's other work
    (here its next mistake, a missing init_from, which still stops it)."""
    args = ["rollout.engine_processes=2", f"trainer.init_from={tmp_path / 'nowhere'}", "hydra.run.dir=run"]
    proc = run_retool("train", *SMOKE, *args, cwd=tmp_path)
    out = " ".join((proc.stdout + proc.stderr).split())
    assert proc.returncode == 1, out
    note = "rollout.engine_processes=2 does nothing here: it applies with rollout.placement=separate"
    assert note in out and out.index(note) < out.index("trainer.init_from="), out
