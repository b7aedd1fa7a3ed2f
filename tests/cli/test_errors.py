"""Bad input on the real command line: one message naming the key and file, exit 1, nothing left behind."""

from __future__ import annotations

from pathlib import Path

from retool_cli.cli import discard_if_empty
from tests.helpers import run_retool, write_jsonl

SMOKE = ["recipe=dapo_smoke", "data.synthetic.num_examples=40", "data.dev_size=4"]


def _runs(root: Path, command: str) -> list[Path]:
    """Run folders left under outputs/COMMAND (the ones a failed run must not leave)."""
    return [p.parent for p in (root / "outputs" / command).rglob(".hydra")] if (root / "outputs").exists() else []


def test_sft_on_an_empty_train_file_fails_naming_key_and_file(tmp_path: Path) -> None:
    empty = write_jsonl(tmp_path / "empty.jsonl", [])
    proc = run_retool("sft", *SMOKE, f"trainer.train_file={empty}", "sft.steps=2", cwd=tmp_path)
    assert proc.returncode == 1
    assert f"trainer.train_file={empty}: the file holds no examples" in proc.stdout + proc.stderr
    assert _runs(tmp_path, "sft") == []


def test_train_on_an_empty_file_fails_before_loading_the_model(tmp_path: Path) -> None:
    empty = write_jsonl(tmp_path / "empty.jsonl", [])
    # a model that does not exist: the data error must come first, before any model is looked for
    proc = run_retool("train", *SMOKE, f"trainer.train_file={empty}", "model.name_or_path=/no/such/model", cwd=tmp_path)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1 and "trainer.train_file=" in out and "/no/such/model" not in out
    assert _runs(tmp_path, "train") == []


def test_a_bad_checkpoint_leaves_no_run_folder(tmp_path: Path) -> None:
    proc = run_retool("eval", *SMOKE, "ckpt=/no/such/checkpoint", cwd=tmp_path)
    assert proc.returncode == 1 and "ckpt=/no/such/checkpoint" in proc.stdout + proc.stderr
    assert _runs(tmp_path, "eval") == []
    assert not (tmp_path / "outputs" / "eval").exists() or not any((tmp_path / "outputs" / "eval").iterdir())


def test_decontaminate_offline_names_the_key_that_takes_a_local_copy(tmp_path: Path) -> None:
    proc = run_retool("decontaminate", *SMOKE, "decontam.benchmarks=[aime24]", cwd=tmp_path)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1
    assert "decontam.benchmark_paths.aime24=FILE_OR_FOLDER" in out and "data.path=" not in out


def test_discard_if_empty_keeps_any_folder_with_outputs(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert not discard_if_empty(tmp_path)  # the working folder itself (hydra.run.dir=.) is never removed
    bare = tmp_path / "outputs" / "day" / "bare"
    (bare / ".hydra").mkdir(parents=True)
    (bare / "run_key.txt").write_text("k\n")
    (bare / "eval.log").write_text("")
    used = tmp_path / "day2" / "used"
    (used / ".hydra").mkdir(parents=True)
    (used / "samples.jsonl").write_text("{}\n")
    assert discard_if_empty(bare) and not (tmp_path / "outputs" / "day").exists()  # its date folder went too
    assert not discard_if_empty(used) and (used / "samples.jsonl").exists()


def test_eval_refuses_a_benchmark_whose_prompts_exceed_the_prompt_budget(tmp_path: Path) -> None:
    proc = run_retool("eval", *SMOKE, "rollout.max_prompt_tokens=8", cwd=tmp_path)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1 and "rollout.max_prompt_tokens=8" in out and "(first: " in out
    assert _runs(tmp_path, "eval") == []


def test_a_layout_the_processes_cannot_take_fails_naming_the_key(tmp_path: Path) -> None:
    """A node rank outside the nodes; an engine spanning processes with the hf engine, or more processes than a
    node runs: each one message naming its key, before any process starts."""
    cases = {
        "trainer.node_rank": ["trainer.nnodes=2", "trainer.node_rank=2"],
        "rollout.vllm_tensor_parallel_size > 1 needs rollout.engine=vllm": ["rollout.vllm_tensor_parallel_size=2"],
        "rollout.loop": ["rollout=vllm", "rollout.vllm_tensor_parallel_size=2", "rollout.loop=async"],
    }
    for expected, extra in cases.items():
        proc = run_retool("train", *SMOKE, *extra, cwd=tmp_path)
        assert proc.returncode == 1 and expected in proc.stdout + proc.stderr, (extra, proc.stderr[-2000:])
    assert _runs(tmp_path, "train") == []


def test_a_config_mistake_is_said_before_torch_loads(tmp_path: Path) -> None:
    """Each Hydra command imports its module (torch, transformers: 5-6 s of a core here) only once the typed
    config holds, so a mistake on the command line is said at once. A fresh interpreter, not the tests' zygote
    (which imported everything before)."""
    import subprocess
    import sys

    probe = (
        "import sys\nfrom retool_cli.cli import main\n"
        "try:\n    main()\nexcept SystemExit as exit:\n    print('exit', exit.code, 'torch' in sys.modules)\n"
    )
    for command in ("train", "sft", "eval", "prepare", "filter-pass-rate", "decontaminate"):
        argv = ["retool", command, "recipe=dapo_smoke", "seed=minus_one", "hydra.run.dir=run"]
        proc = subprocess.run(
            [sys.executable, "-c", f"import sys; sys.argv = {argv!r}\n{probe}"],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert proc.stdout.strip().splitlines()[-1] == "exit 1 False", (command, proc.stdout, proc.stderr[-2000:])
        assert "seed" in proc.stdout + proc.stderr and not (tmp_path / "run").exists()
