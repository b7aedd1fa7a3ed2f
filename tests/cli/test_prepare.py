"""`retool prepare` end to end through the real command line, in a temporary working directory."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from retool_cli.files import sha256_file
from tests.helpers import die_after, read_jsonl, run_retool, write_jsonl


def only_run_dir(root: Path) -> Path:
    dirs = [p.parent for p in root.rglob("manifest.json")]
    assert len(dirs) == 1, dirs
    return dirs[0]


def test_prepare_smoke_recipe(tmp_path: Path) -> None:
    proc = run_retool("prepare", "recipe=dapo_smoke", cwd=tmp_path, check=True)
    run_dir = only_run_dir(tmp_path / "outputs" / "prepare")
    assert (run_dir / ".hydra" / "config.yaml").is_file()
    assert (run_dir / "prepare.log").is_file()
    train, dev = read_jsonl(run_dir / "train.jsonl"), read_jsonl(run_dir / "dev.jsonl")
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert len(train) == manifest["counts"]["train"] == 1800
    assert len(dev) == manifest["counts"]["dev"] == 200
    assert manifest["counts"]["read"] == 2000
    assert manifest["config"]["data"]["source"] == "synthetic"
    for name in ("train.jsonl", "dev.jsonl"):
        assert manifest["files"][name]["sha256"] == sha256_file(run_dir / name)
    assert not {r["id"] for r in train} & {r["id"] for r in dev}
    assert set(train[0]) == {"id", "question", "answer", "data_source", "solution_code"}
    assert "train.jsonl" in proc.stdout and "1800" in proc.stdout  # the summary table


OUTPUTS = ("train.jsonl", "dev.jsonl", "manifest.json")


def test_prepare_killed_while_writing_leaves_no_output_and_a_rerun_writes_all(tmp_path: Path) -> None:
    """SIGKILL after each staged file: none of the outputs in the run folder (not even a previous run's mixed
    with new ones); the rerun writes all three and leaves no staging folder."""
    args = ["prepare", "recipe=dapo_smoke", "data.synthetic.num_examples=60", "data.dev_size=10", "hydra.run.dir=out"]
    for written in (1, 2):
        die_after(args, tmp_path, f"file:{written}")
        assert not [name for name in OUTPUTS if (tmp_path / "out" / name).exists()]
    run_retool(*args, cwd=tmp_path, check=True)
    out = tmp_path / "out"
    assert all((out / name).is_file() for name in OUTPUTS) and not (out / ".prepare-staging").exists()
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["files"]["dev.jsonl"]["sha256"] == sha256_file(out / "dev.jsonl")


def test_prepare_killed_between_renames_is_refused_by_readers_until_rerun(tmp_path: Path) -> None:
    """Killed after moving train.jsonl into place, before dev.jsonl: a command reading that train.jsonl refuses
    it (naming the file and the unfinished prepare) instead of training on a split whose dev half is missing;
    the rerun makes the folder whole and the same file is read."""
    args = ["prepare", "recipe=dapo_smoke", "data.synthetic.num_examples=60", "data.dev_size=10", "hydra.run.dir=out"]
    die_after(args, tmp_path, "placed:1")
    out = tmp_path / "out"
    assert (out / "train.jsonl").is_file() and not (out / "dev.jsonl").exists()
    sft = ["sft", "recipe=dapo_smoke", "sft.steps=1", "trainer.train_file=out/train.jsonl", "hydra.run.dir=sft"]
    proc = run_retool(*sft, cwd=tmp_path)
    message = " ".join((proc.stdout + proc.stderr).split())  # the error, unwrapped
    assert proc.returncode != 0 and "out/train.jsonl" in message and "did not finish" in message
    assert not (tmp_path / "sft" / "checkpoints").exists()
    run_retool(*args, cwd=tmp_path, check=True)
    assert all((out / name).is_file() for name in OUTPUTS) and not (out / ".prepare-staging").exists()
    run_retool(*sft, cwd=tmp_path, check=True)


def test_prepare_is_deterministic_per_seed(tmp_path: Path) -> None:
    hashes = []
    for i, seed in enumerate([5, 5, 6]):
        out = tmp_path / f"run{i}"
        run_retool(
            "prepare",
            f"seed={seed}",
            "data.synthetic.num_examples=200",
            "data.dev_size=20",
            f"hydra.run.dir={out}",
            cwd=tmp_path,
            check=True,
        )
        hashes.append(json.loads((out / "manifest.json").read_text())["files"]["train.jsonl"]["sha256"])
    assert hashes[0] == hashes[1] != hashes[2]


def test_multirun_makes_one_folder_per_job(tmp_path: Path) -> None:
    # flags after overrides, as users type them
    run_retool(
        "prepare",
        "data.synthetic.num_examples=50",
        "data.dev_size=5",
        "-m",
        "seed=1,2",
        cwd=tmp_path,
        check=True,
    )
    manifests = sorted((tmp_path / "outputs" / "prepare" / "multirun").rglob("manifest.json"))
    assert [m.parent.name for m in manifests] == ["0", "1"]
    seeds = [json.loads(m.read_text())["seed"] for m in manifests]
    assert seeds == [1, 2]


def test_joblib_launcher(tmp_path: Path) -> None:
    run_retool(
        "prepare",
        "hydra/launcher=joblib",
        "-m",
        "seed=1,2",
        "data.synthetic.num_examples=40",
        "data.dev_size=4",
        cwd=tmp_path,
        check=True,
    )
    assert len(list((tmp_path / "outputs" / "prepare" / "multirun").rglob("manifest.json"))) == 2


def test_cfg_job_prints_composed_config(tmp_path: Path) -> None:
    proc = run_retool("prepare", "seed=3", "--cfg", "job", "data=aime24", cwd=tmp_path, check=True)
    assert "seed: 3" in proc.stdout and "source: aime24" in proc.stdout
    assert not (tmp_path / "outputs").exists()


def test_prepare_local_file_with_column_mapping(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "mine.jsonl", [{"q": f"What is {i}+1?", "a": i + 1} for i in range(10)])
    run_retool(
        "prepare",
        "data=file",
        f"data.path={path}",
        "data.columns.question=q",
        "data.columns.answer=a",
        "data.name=mine",
        "data.dev_size=2",
        "hydra.run.dir=out",
        cwd=tmp_path,
        check=True,
    )
    rows = read_jsonl(tmp_path / "out" / "train.jsonl") + read_jsonl(tmp_path / "out" / "dev.jsonl")
    assert sorted(r["answer"] for r in rows) == sorted(str(i + 1) for i in range(10))
    assert {r["data_source"] for r in rows} == {"mine"}


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("data.nope=1", "Key 'nope' not in 'DataConfig'"),
        ("data=nope", "Available options in 'data'"),
        ("recipe=nope", "Available options in 'recipe'"),
        ("data.source=bogus", "Invalid value 'bogus', expected one of [synthetic"),
        ("seed=abc", "full_key: seed"),
        ("data.dev_size=-1", "data.dev_size: must be >= 0"),
        ("data=file", "data.path"),
        ("data.synthetic.kinds=[product,nope]", "data.synthetic.kinds: unknown ['nope']"),
    ],
)
def test_bad_overrides_fail_clearly(tmp_path: Path, override: str, expected: str) -> None:
    proc = run_retool("prepare", override, "hydra.run.dir=out", cwd=tmp_path)
    assert proc.returncode != 0
    output = proc.stdout + proc.stderr
    assert expected in output
    assert "Traceback" not in output
    assert not list(tmp_path.rglob("*.jsonl"))


def test_malformed_input_names_file_and_line_and_writes_nothing(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "broken.jsonl", [{"problem": "p1", "answer": "1"}, '{"problem": "p2", '])
    proc = run_retool("prepare", "data=file", f"data.path={path}", "hydra.run.dir=out", cwd=tmp_path)
    assert proc.returncode == 1
    assert f"{path}:2: malformed JSON" in proc.stdout + proc.stderr
    assert not list((tmp_path / "out").glob("*.jsonl")) and not (tmp_path / "out" / "manifest.json").exists()


def test_help_lists_working_commands_and_groups(tmp_path: Path) -> None:
    top = run_retool("--help", cwd=tmp_path, check=True).stdout
    assert "prepare" in top
    sub = run_retool("prepare", "--help", cwd=tmp_path, check=True).stdout
    assert "data: aime24, aime25, dapo_math_17k, file, math500, synthetic" in sub
    assert "recipe: dapo_smoke" in sub
    assert "protocol: chat_tool, none, retool_tags" in sub and "rollout: hf, vllm" in sub


def test_non_editable_install_ships_configs_and_recipes(tmp_path: Path) -> None:
    """A wheel installed elsewhere runs from any directory: conf/ (with its recipe group) ships inside the
    package, and a user's own config folder adds recipes to it."""
    import subprocess
    import sys

    # built from a copy of the sources: setuptools writes build/ next to what it builds, never into the checkout
    repo, source = Path(__file__).resolve().parents[2], tmp_path / "source"
    for name in ("retool_cli", "conf"):
        shutil.copytree(repo / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(repo / name, source / name)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            str(source),
            "-w",
            str(tmp_path / "whl"),
        ],
        check=True,
        capture_output=True,
    )
    wheel = next((tmp_path / "whl").glob("*.whl"))
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(tmp_path / "site"), str(wheel)],
        check=True,
        capture_output=True,
    )
    work = tmp_path / "elsewhere"
    work.mkdir()
    env = {"PYTHONPATH": str(tmp_path / "site"), "PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1"}

    def installed_retool(*args: str) -> subprocess.CompletedProcess:
        """`retool ARGS` from the installed copy (it prints where it was imported from first)."""
        main = "import retool_cli, sys; print(retool_cli.__file__); sys.argv[0] = 'retool'; "
        main += "from retool_cli.cli import main; main()"
        proc = subprocess.run([sys.executable, "-c", main, *args], cwd=work, env=env, capture_output=True, text=True)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return proc

    proc = installed_retool("prepare", "recipe=dapo_smoke", "hydra.run.dir=run")
    assert proc.stdout.startswith(str(tmp_path / "site"))  # the installed copy, not the checkout
    assert len(read_jsonl(work / "run" / "train.jsonl")) == 1800
    (work / "mine" / "recipe").mkdir(parents=True)
    (work / "mine" / "recipe" / "tiny_run.yaml").write_text(
        "# @package _global_\ndefaults:\n  - dapo_smoke\ndata:\n  dev_size: 7\n"
    )
    installed_retool("prepare", "--config-dir", "mine", "recipe=tiny_run", "hydra.run.dir=run2")
    assert len(read_jsonl(work / "run2" / "dev.jsonl")) == 7  # the user's recipe, on top of the shipped one


def test_copy_recipe_out_edit_it_and_use_it(tmp_path: Path) -> None:
    out = run_retool("copy-recipe", "dapo_smoke", "--to", "my_conf", "--as", "quick", cwd=tmp_path, check=True)
    copied = tmp_path / "my_conf" / "recipe" / "quick.yaml"
    assert "recipe=quick" in out.stdout and copied.read_text().startswith("# @package _global_")
    copied.write_text(copied.read_text().replace("total_steps: 60", "total_steps: 3"))
    job = run_retool("train", "--config-dir", "my_conf", "recipe=quick", "--cfg", "job", cwd=tmp_path, check=True)
    assert "total_steps: 3" in job.stdout
    again = run_retool("copy-recipe", "dapo_smoke", "--to", "my_conf", "--as", "quick", cwd=tmp_path)
    assert again.returncode == 1 and "exists" in again.stderr  # never overwrites an edited copy
    missing = run_retool("copy-recipe", "nope", cwd=tmp_path)
    assert missing.returncode == 1 and "dapo_smoke" in missing.stderr


@pytest.mark.parametrize("command", ["prepare", "decontaminate", "filter-pass-rate", "sft", "train", "eval"])
def test_each_command_help_says_what_it_does_and_documents_its_keys(tmp_path: Path, command: str) -> None:
    from retool_cli.help import COMMANDS, field_docs

    out = run_retool(command, "--help", cwd=tmp_path, check=True).stdout
    spec, docs = COMMANDS[command], field_docs()
    assert out.startswith(f"retool {command}: {spec.what}")
    assert "Reads:" in out and "Writes:" in out and "Examples:" in out
    for key in spec.keys:
        assert f"  {key}" in out and docs[key].split()[0] in out  # every key, with its documentation
    assert "sandbox:\n" not in out and len(out.splitlines()) < 80  # not the composed-config dump


def test_help_shows_the_values_a_recipe_gives_and_cfg_job_stays_the_full_dump(tmp_path: Path) -> None:
    out = run_retool("eval", "recipe=retool_qwen2.5_7b", "--help", cwd=tmp_path, check=True).stdout
    assert "benchmark.n_samples = 32" in out and "rollout.engine = vllm" in out
    dump = run_retool("eval", "--cfg", "job", cwd=tmp_path, check=True).stdout
    assert "sandbox:" in dump and len(dump.splitlines()) > 150
