"""`retool sft` and `retool train` end to end with the tiny model, including exact resume after SIGKILL."""

from __future__ import annotations

import json
import shutil
from collections import Counter
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from tests.helpers import SFT, TINY, comparable, die_after, read_jsonl, run_retool

TRAIN = [
    *TINY,
    "trainer.total_steps=3",  # a resume from step 1 or 2 has a step (and its rollouts) after it to compare
    "trainer.save_every=1",
    "trainer.questions_per_step=2",
    "rollout.group_size=4",
    "rollout.max_response_tokens=64",
    "rollout.max_tokens_per_turn=48",
]


# A KL term to the reference policy (the run's initial weights), large enough to move the update: a resumed run's
# reference must be those weights again, not its checkpoint's
KL = ["trainer.kl_coef=0.05", "trainer.lr=1e-3"]


def metrics_of(folder: Path) -> list[dict]:
    [path] = list(folder.rglob("metrics.jsonl"))
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_sft_learns_and_writes_a_loadable_checkpoint(sft_checkpoint: Path) -> None:
    rows = [json.loads(line) for line in (sft_checkpoint / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(5, 61, 5))
    assert rows[-1]["loss"] < rows[0]["loss"] * 0.8
    # traces of different lengths, right-padded per micro-batch: some positions are padding, most are not
    assert all(0 <= r["train/padding_share"] < 0.5 for r in rows) and any(r["train/padding_share"] > 0 for r in rows)
    assert all(r["time/train_tokens_per_s"] > 0 for r in rows)
    checkpoint = sft_checkpoint / "checkpoints" / "step_60"
    model = AutoModelForCausalLM.from_pretrained(checkpoint)  # HF format: from_pretrained (and vLLM) load it
    assert sum(p.numel() for p in model.parameters()) > 0
    assert (checkpoint / "tokenizer.json").exists() and (checkpoint / "trainer_state.pt").exists()
    assert (sft_checkpoint / "sft.png").exists()


@pytest.mark.parametrize(
    ("extra", "steps"), [([], 60), (["model.lora_rank=4", "sft.lr=1e-3", "sft.steps=30"], 30)], ids=["full", "lora"]
)
def test_sft_resumes_exactly_after_sigkill(sft_checkpoint: Path, tmp_path: Path, extra: list[str], steps: int) -> None:
    """Killed 5 steps past its checkpoint at step 20, the same command continues from that checkpoint (batches,
    RNG, optimizer and schedule restored; LoRA: the base weights plus the checkpoint's adapter): the losses and
    the final weights of the uninterrupted run (the shared SFT run, tests/conftest.py; LoRA's its own)."""
    args = ["sft", *SFT, *extra]
    reference = sft_checkpoint
    if extra:
        run_retool(*args, "hydra.run.dir=whole", cwd=tmp_path, check=True)
        reference = tmp_path / "whole"
    broken = tmp_path / "broken"
    broken.mkdir()
    die_after(args, cwd=broken, when="step:25")
    [killed] = [p.parent for p in broken.rglob("metrics.jsonl")]
    assert sorted(p.name for p in (killed / "checkpoints").iterdir()) == ["step_20"]  # keep_last=1
    run_retool(*args, cwd=broken, check=True)
    [run] = [p.parent for p in broken.rglob("final.txt")]
    assert run == killed  # continued in the killed run's folder
    assert [r["step"] for r in metrics_of(run)] == list(range(5, steps + 1, 5))  # 21-25 redone, not logged twice
    assert [comparable_sft(r) for r in metrics_of(run)] == [comparable_sft(r) for r in metrics_of(reference)]
    files = ["model.safetensors"] + (["adapter/adapter_model.safetensors"] if extra else [])
    for name in files:
        resumed, uninterrupted = (load_file(r / "checkpoints" / f"step_{steps}" / name) for r in (run, reference))
        assert resumed.keys() == uninterrupted.keys()
        assert all(torch.equal(resumed[k], uninterrupted[k]) for k in uninterrupted)


def comparable_sft(row: dict) -> dict:
    return {k: v for k, v in row.items() if k != "seconds" and not k.startswith("time/")}


def test_train_runs_and_resumes_exactly_after_sigkill(sft_checkpoint: Path, tmp_path: Path) -> None:
    """Killed after step 2, with that checkpoint then damaged: the same command resumes from the last complete
    checkpoint (step 1) and ends with the metrics and kept trajectories of an uninterrupted run (steps 2 and 3:
    step 3's rollouts come from step 2's update, made with the optimizer state restored from step 1). With a KL
    term to the initial policy, whose weights the resumed run loads again (its own are step 1's)."""
    whole, broken = tmp_path / "whole", tmp_path / "broken"
    whole.mkdir()
    broken.mkdir()
    args = ["train", *TRAIN, f"trainer.init_from={sft_checkpoint}", *KL]
    args += ["trainer.mask_truncated=false", "reward.overlong_buffer_tokens=48"]  # lengths vary the reward
    run_retool(*args, cwd=whole, check=True)
    reference = metrics_of(whole)
    assert [r["step"] for r in reference] == [1, 2, 3] and reference[2]["train/kl_ref"] > 0
    assert {"reward/mean", "train/accuracy", "rollout/code_calls", "train/grad_norm", "train/lr"} <= set(reference[0])
    die_after(args, cwd=broken, when="step:2")  # killed right after step 2
    # and its step-2 checkpoint damaged afterwards (a copy cut short): resume passes over it, to step 1's
    [weights] = broken.rglob("checkpoints/step_2/model.safetensors")
    weights.write_bytes(weights.read_bytes()[:1000])
    resumed = run_retool(*args, cwd=broken, check=True)  # the same command continues the killed run
    assert "passing over the incomplete checkpoint step_2" in " ".join((resumed.stdout + resumed.stderr).split())
    assert comparable(metrics_of(broken)) == comparable(reference)
    # the trajectories kept for `retool report`: up to keep_rollouts a step, the same after the resume
    [kept] = [read_jsonl(p) for p in whole.rglob("rollouts.jsonl")]
    assert sorted({r["step"] for r in kept}) == [1, 2, 3] and max(Counter(r["step"] for r in kept).values()) <= 4
    assert {"segments", "reward", "correct", "question", "reference", "stop_reason"} <= set(kept[0])
    assert [read_jsonl(p) for p in broken.rglob("rollouts.jsonl")] == [kept]
    [run] = [p.parent for p in broken.rglob("final.txt")]
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step_2", "step_3"]  # keep_last=2
    assert (run / "train.png").exists()
    # the finished run's folder again with trainer.resume=false: started over there, nothing appended
    run_retool(*args, "trainer.resume=false", f"hydra.run.dir={run}", cwd=broken, check=True)
    assert comparable(read_jsonl(run / "metrics.jsonl")) == comparable(reference)
    assert read_jsonl(run / "rollouts.jsonl") == kept


def test_periodic_eval_is_logged(sft_checkpoint: Path, tmp_path: Path) -> None:
    run_retool(
        "train",
        *TRAIN,
        "trainer.total_steps=2",
        "trainer.eval_every=2",
        "trainer.eval_problems=3",
        "benchmark.n_samples=2",
        "benchmark.max_response_tokens=48",
        "eval.bootstrap=200",
        f"trainer.init_from={sft_checkpoint}",
        "hydra.run.dir=run",
        cwd=tmp_path,
        check=True,
    )
    rows = metrics_of(tmp_path / "run")
    assert "eval/accuracy" not in rows[0] and 0.0 <= rows[1]["eval/accuracy"] <= 1.0
    assert len((tmp_path / "run" / "evals" / "step_2" / "samples.jsonl").read_text().splitlines()) == 6


def test_two_processes_with_torchrun(sft_checkpoint: Path, tmp_path: Path) -> None:
    """trainer.nproc=2 relaunches through torchrun (gloo on CPU): one run folder, rank 0 writes it (metrics,
    checkpoints, the periodic eval). The ranks as fresh interpreters, as with CUDA (RETOOL_RANK_START=exec; the
    other multi-process tests fork them from torchrun's agent, as on CPU)."""
    result = run_retool(
        "train",
        *TRAIN,
        "trainer.total_steps=2",
        "trainer.nproc=2",
        f"trainer.init_from={sft_checkpoint}",
        "trainer.eval_every=2",
        "trainer.eval_problems=3",
        "benchmark.n_samples=2",
        "benchmark.max_response_tokens=48",
        "hydra.run.dir=run",
        cwd=tmp_path,
        check=True,
        env={"RETOOL_RANK_START": "exec"},
    )
    assert "--nproc_per_node=2 -m retool_cli train" in " ".join((result.stdout + result.stderr).split())
    rows = metrics_of(tmp_path / "run")
    assert [r["step"] for r in rows] == [1, 2]  # written once, by rank 0
    assert 0.0 <= rows[1]["eval/accuracy"] <= 1.0  # the periodic eval runs on rank 0 only: 3 x 2 samples
    assert len((tmp_path / "run" / "evals" / "step_2" / "samples.jsonl").read_text().splitlines()) == 6
    assert (tmp_path / "run" / "final.txt").exists()
    assert sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir()) == ["step_1", "step_2"]


def test_lora_with_bf16_resumes_exactly_from_its_adapter(sft_checkpoint: Path, tmp_path: Path) -> None:
    """model.lora_rank with bf16 autocast and bf16 sampling: checkpoints hold merged weights and the adapter;
    a run resumed from step 1 (adapter + optimizer state) writes the same later metrics as the whole run, its KL
    term still to the initial weights (not to those plus the checkpoint's adapter)."""
    args = [
        "train",
        *TRAIN,
        "trainer.total_steps=3",
        "trainer.keep_last=3",
        "model.lora_rank=4",
        "trainer.bf16_autocast=true",
        "rollout.dtype=bfloat16",
        *KL,
        f"trainer.init_from={sft_checkpoint}",
        "hydra.run.dir=run",
        "trainer.mask_truncated=false",
        "reward.overlong_buffer_tokens=48",
    ]  # lengths vary the reward
    run_retool(*args, cwd=tmp_path, check=True)
    run = tmp_path / "run"
    whole = comparable(metrics_of(run))
    assert [r["step"] for r in whole] == [1, 2, 3] and whole[1]["train/grad_norm"] > 0 and whole[2]["train/kl_ref"] > 0
    assert (run / "checkpoints" / "step_3" / "adapter" / "adapter_model.safetensors").exists()
    AutoModelForCausalLM.from_pretrained(run / "checkpoints" / "step_3")  # merged weights, plain HF format
    for step in (2, 3):  # resume from step 1: step 3's rollouts depend on step 2's Adam update from its state
        shutil.rmtree(run / "checkpoints" / f"step_{step}")
    (run / "final.txt").unlink()
    run_retool(*args, cwd=tmp_path, check=True)
    assert comparable(metrics_of(run)) == whole


def test_fsdp2_two_processes_checkpoint_and_resume(sft_checkpoint: Path, tmp_path: Path) -> None:
    """trainer.fsdp=true with 2 processes: rollouts on all-gathered weights, checkpoints gathered to rank 0
    (plain HF weights), and a resume from step 1 (optimizer state re-sharded) repeats steps 2 and 3 exactly; the
    KL term's reference (whole on each process) is the initial weights in both."""
    args = [
        "train",
        *TRAIN,
        "trainer.total_steps=3",
        "trainer.keep_last=3",
        "trainer.nproc=2",
        "trainer.fsdp=true",
        f"trainer.init_from={sft_checkpoint}",
        "hydra.run.dir=run",
        "trainer.mask_truncated=false",
        "reward.overlong_buffer_tokens=48",
        *KL,
    ]
    run_retool(*args, cwd=tmp_path, check=True)
    run = tmp_path / "run"
    whole = comparable(metrics_of(run))
    assert [r["step"] for r in whole] == [1, 2, 3] and whole[1]["train/grad_norm"] > 0 and whole[2]["train/kl_ref"] > 0
    AutoModelForCausalLM.from_pretrained(run / "checkpoints" / "step_3")
    for step in (2, 3):  # resume from step 1: step 3's rollouts depend on step 2's Adam update from its state
        shutil.rmtree(run / "checkpoints" / f"step_{step}")
    (run / "final.txt").unlink()
    run_retool(*args, cwd=tmp_path, check=True)
    assert comparable(metrics_of(run)) == whole


def test_fsdp2_with_gradient_checkpointing_makes_the_same_updates(sft_checkpoint: Path, tmp_path: Path) -> None:
    """The GPU recipe's combination (FSDP2 + activation checkpointing): the same metrics, gradient norms
    included, as FSDP2 without checkpointing, on 2 CPU processes. Both sample through transformers' own forward
    (model.accelerate=false, as for a model the fast paths do not cover), FSDP's hooks in every decode step,
    each process its own number of steps; the first also evaluates every step on rank 0 alone. Neither may
    gather in those forwards (a collective the other process never joins: a hang), and the evaluation leaves
    the training as it was."""
    runs = {}
    for checkpointing, evaluating in (("true", 1), ("false", 0)):
        run_retool(
            "train",
            *TRAIN,
            "trainer.total_steps=2",
            "trainer.nproc=2",
            "trainer.fsdp=true",
            "model.accelerate=false",
            f"trainer.eval_every={evaluating}",
            "trainer.eval_problems=2",
            "benchmark.n_samples=2",
            "benchmark.max_response_tokens=48",
            f"trainer.gradient_checkpointing={checkpointing}",
            f"trainer.init_from={sft_checkpoint}",
            "trainer.mask_truncated=false",
            "reward.overlong_buffer_tokens=48",
            f"hydra.run.dir=run_{checkpointing}",
            cwd=tmp_path,
            check=True,
            timeout=240,
        )
        runs[checkpointing] = comparable(metrics_of(tmp_path / f"run_{checkpointing}"))
    assert all("eval/accuracy" in row for row in runs["true"])
    assert any(row["train/grad_norm"] > 0 for row in runs["true"])
    without_eval = [{k: v for k, v in row.items() if not k.startswith("eval/")} for row in runs["true"]]
    assert without_eval == runs["false"]


def test_a_bf16_sampler_shows_a_gap_that_the_correction_bounds(sft_checkpoint: Path, tmp_path: Path) -> None:
    """A real sampler-trainer mismatch: the hf engine samples from a bfloat16 copy (rollout.dtype) next to the
    fp32 trainer. The gap metrics see it (and read ~0 with the shared fp32 weights); seq_mask with bounds [1, 1]
    masks every sequence that differs at all, so the same rollouts give no gradient, where `none` trains on them."""
    args = [
        "train",
        *TRAIN,
        "trainer.total_steps=1",
        f"trainer.init_from={sft_checkpoint}",
        "trainer.mask_truncated=false",
        "reward.overlong_buffer_tokens=48",
    ]
    runs = {
        "fp32": ["rollout.dtype=auto"],
        "bf16": ["rollout.dtype=bfloat16"],
        "masked": [
            "rollout.dtype=bfloat16",
            "trainer.rollout_correction=seq_mask",
            "trainer.rollout_correction_bounds=[1,1]",
        ],
    }
    rows = {}
    for name, extra in runs.items():
        run_retool(*args, *extra, f"hydra.run.dir={name}", cwd=tmp_path, check=True)
        [rows[name]] = metrics_of(tmp_path / name)
    fp32, bf16, masked = rows["fp32"], rows["bf16"], rows["masked"]
    assert fp32["train/mismatch_abs_logprob_diff"] < 1e-5 < 1e-3 < bf16["train/mismatch_abs_logprob_diff"]
    assert bf16["train/mismatch_kl_k3"] > 0 and bf16["train/mismatch_max_ratio"] > 1 > bf16["train/mismatch_min_ratio"]
    assert masked["train/mismatch_abs_logprob_diff"] == bf16["train/mismatch_abs_logprob_diff"]  # the same rollouts
    assert bf16["train/grad_norm"] > 0 and masked["train/mismatch_outside_share"] == 1.0
    assert masked["train/grad_norm"] == 0.0


def test_packed_sft_and_train_match_the_padded_runs(sft_checkpoint: Path, tmp_path: Path) -> None:
    """`sft.pack_sequences` gives the shared SFT run's losses with no padding computed; `trainer.pack_sequences`
    over 2 FSDP2 processes with activation checkpointing gives the padded run's first step (the same rollouts,
    the same update to fp32 rounding)."""
    run_retool("sft", *SFT, "sft.pack_sequences=true", "hydra.run.dir=sft_packed", cwd=tmp_path, check=True)
    packed, padded = metrics_of(tmp_path / "sft_packed"), metrics_of(sft_checkpoint)
    assert [r["step"] for r in packed] == [r["step"] for r in padded]
    assert all(r["loss"] == pytest.approx(p["loss"], rel=1e-4) for r, p in zip(packed, padded, strict=True))
    assert all(r["train/padding_share"] == 0 for r in packed) and any(p["train/padding_share"] > 0 for p in padded)
    rows = {}
    for pack in ("true", "false"):
        run_retool(
            "train",
            *TRAIN,
            "trainer.total_steps=1",
            "trainer.nproc=2",
            "trainer.fsdp=true",
            "trainer.gradient_checkpointing=true",
            f"trainer.pack_sequences={pack}",
            f"trainer.init_from={sft_checkpoint}",
            "trainer.mask_truncated=false",
            "reward.overlong_buffer_tokens=48",
            f"hydra.run.dir=train_{pack}",
            cwd=tmp_path,
            check=True,
        )
        [rows[pack]] = comparable(metrics_of(tmp_path / f"train_{pack}"))
    assert rows["false"]["train/padding_share"] > 0 == rows["true"]["train/padding_share"]
    assert rows["true"]["train/grad_norm"] > 0
    # the same rollouts; the metrics over every process equal (packing deals samples out to the processes by
    # tokens, so what one process saw, such as its clip fraction, differs); the same weights after the update
    for key in ("train/loss", "train/grad_norm", "train/entropy", "train/mismatch_kl_k3", "reward/mean"):
        assert rows["true"][key] == pytest.approx(rows["false"][key], rel=1e-4, abs=1e-6), key
    packed, padded = (
        load_file(tmp_path / f"train_{p}" / "checkpoints" / "step_1" / "model.safetensors") for p in ("true", "false")
    )
    # AdamW's first step moves each weight by lr x g / (|g| + eps): the same to rounding, except where g itself is
    # at rounding level and its sign may differ (then at most 2 lr apart)
    differences = torch.cat([(packed[k] - padded[k]).abs().flatten() for k in padded])
    assert (differences < 1e-6).float().mean() > 0.99 and differences.max() <= 2.01e-4


def test_a_model_that_cannot_pack_is_refused_before_training(tmp_path: Path) -> None:
    """`sft.pack_sequences` / `trainer.pack_sequences` with a decoder whose positions also meet in a convolution
    layer (a hybrid LFM2, random init, the tiny model's tokenizer): each command stops as the model loads, with
    an error naming the model and the setting to turn off, and no step, checkpoint or metrics written."""
    from transformers import AutoConfig

    from retool_cli.model.tiny import tiny_model_path

    folder = tmp_path / "lfm2"
    shutil.copytree(tiny_model_path(), folder)
    tiny = json.loads((folder / "config.json").read_text())
    config = AutoConfig.for_model(
        "lfm2", vocab_size=tiny["vocab_size"], hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, layer_types=["conv", "full_attention"], full_attn_idxs=[1],
        pad_token_id=tiny["pad_token_id"], bos_token_id=tiny["bos_token_id"], eos_token_id=tiny["eos_token_id"],
    )  # fmt: skip
    AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    model = f"model.name_or_path={folder}"
    for command, key, args in (("sft", "sft", SFT), ("train", "trainer", TRAIN)):
        proc = run_retool(command, *args, model, f"{key}.pack_sequences=true", f"hydra.run.dir={command}", cwd=tmp_path)
        said = " ".join((proc.stdout + proc.stderr).split())  # the error, as the terminal wrapped it
        assert proc.returncode != 0 and "Traceback" not in said, said[-3000:]
        assert "Lfm2ForCausalLM cannot train on packed rows" in said and f"{key}.pack_sequences=false" in said
        metrics = tmp_path / command / "metrics.jsonl"
        assert not (tmp_path / command / "checkpoints").exists()
        assert not metrics.exists() or not read_jsonl(metrics), said[-3000:]
