"""End to end with a real tokenizer: small random-init Qwen2 models over the real Qwen2.5 vocabulary (151,665
tokens), saved as the model folders users pass. A model trained to imitate one trajectory per protocol
reproduces it through the agent loop with both engines (the code runs in the real sandbox, the result returns,
the judge scores the answer), including `</code>` ending inside the sampled token `>\\n\\n`; and the commands
(`sft` on ReTool-SFT-shaped traces, `train`, `eval`) run with both engines and both protocols."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from retool_cli.config import Isolation, RewardConfig, RolloutConfig, SandboxConfig
from retool_cli.data.dataset import MathExample
from retool_cli.env.protocol import ChatToolProtocol, TaggedProtocol
from retool_cli.env.reward import Verifier, score_batch
from retool_cli.env.sandbox import Sandbox
from retool_cli.env.tools import CodeInterpreter
from retool_cli.interfaces import Sampling
from retool_cli.rollout.agent import run_rollouts
from retool_cli.rollout.hf_engine import HFEngine
from tests.helpers import read_jsonl, run_retool
from tests.real_models import build_model_folder, load_real_tokenizer, tokenizer_folder

EXAMPLE = MathExample("p0", "What is 6 times 7?", "42", "test")
CODE = "print(6 * 7)"
FINAL = "The answer is \\boxed{42}."
# retool_tags: the model's turn ends in the token `>\n\n`, carrying text past the stop string `</code>`
TAGGED_TURN = f"I will compute it.\n<code>\n```python\n{CODE}\n```\n</code>\n\n"
SYSTEM = "Solve it. Use <code> for hard arithmetic. Answer in \\boxed{}."


@pytest.fixture(scope="module")
def random_model(tmp_path_factory) -> Path:
    return build_model_folder("qwen2.5-instruct", tmp_path_factory.mktemp("qwen2.5-random") / "model")


@pytest.fixture(scope="module")
def tokenizer():
    return load_real_tokenizer("qwen2.5-instruct")


def protocols(tokenizer) -> dict:
    return {"retool_tags": TaggedProtocol(tokenizer, SYSTEM), "chat_tool": ChatToolProtocol(tokenizer, SYSTEM)}


def target(protocol, tokenizer) -> tuple[list[int], list[int]]:
    """(ids, mask) of the trajectory to imitate: prompt, a turn that calls the interpreter, its result, the
    answer; mask 1 on the model's tokens."""
    turn = TAGGED_TURN if isinstance(protocol, TaggedProtocol) else "I will compute it." + protocol.call_text(CODE)
    pieces = [
        (protocol.prompt_ids(EXAMPLE.question), 0),
        (tokenizer.encode(turn, add_special_tokens=False), 1),
        (protocol.result_ids("42"), 0),
        ([*tokenizer.encode(FINAL, add_special_tokens=False), tokenizer.eos_token_id], 1),
    ]
    return [i for ids, _ in pieces for i in ids], [m for ids, m in pieces for _ in ids]


def imitate(model, sequences: list[tuple[list[int], list[int]]], max_steps: int = 600) -> int:
    """Train until greedy decoding reproduces every model token of every sequence; returns the steps taken.
    Logits only where a model token is predicted: the 151k-entry head stays cheap."""
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    for step in range(1, max_steps + 1):
        optimizer.zero_grad()
        exact = True
        for ids, mask in sequences:
            where = torch.tensor([i - 1 for i in range(1, len(ids)) if mask[i]])
            hidden = model.model(input_ids=torch.tensor([ids])).last_hidden_state[0, where]  # (M, H)
            logits = model.lm_head(hidden)  # (M, V)
            wanted = torch.tensor(ids)[where + 1]
            torch.nn.functional.cross_entropy(logits, wanted).backward()
            exact &= bool((logits.argmax(-1) == wanted).all())
        if exact:
            return step
        optimizer.step()
    raise AssertionError(f"the model did not learn to imitate the trajectories in {max_steps} steps")


@pytest.fixture(scope="module")
def imitating_model(random_model: Path, tokenizer, tmp_path_factory) -> Path:
    """The random model trained to imitate one trajectory of each protocol, saved as a model folder."""
    model = AutoModelForCausalLM.from_pretrained(random_model, dtype=torch.float32)
    torch.manual_seed(0)
    steps = imitate(model, [target(p, tokenizer) for p in protocols(tokenizer).values()])
    print(f"imitation learned in {steps} steps")
    out = tmp_path_factory.mktemp("qwen2.5-imitating") / "model"
    model.save_pretrained(out)
    for file in tokenizer_folder("qwen2.5-instruct").iterdir():
        shutil.copy(file, out / file.name)
    return out


def rollout(engine, protocol, sandbox):
    cfg = RolloutConfig(group_size=1, max_response_tokens=160, max_turns=3, max_code_calls=2, overlap_sandbox=False)
    tools = [CodeInterpreter(sandbox, protocol.tokenizer, cfg)]
    [t], _ = run_rollouts(
        [EXAMPLE], engine, protocol, tools, cfg, seed=0, max_context_tokens=1024, sampling=Sampling(0.0)
    )
    return t


@pytest.mark.parametrize("engine_name", ["hf", "vllm"])
def test_an_imitating_model_reproduces_its_trajectory_through_the_loop(
    engine_name, imitating_model: Path, tokenizer, request: pytest.FixtureRequest
) -> None:
    if engine_name == "hf":
        model = AutoModelForCausalLM.from_pretrained(imitating_model, dtype=torch.float32)
        engine = HFEngine(model, tokenizer)
    else:
        from retool_cli.rollout.vllm_engine import VLLMEngine

        engine = VLLMEngine(
            str(imitating_model), torch.float32, 0, 1024, 0.5, sleep_mode=False, kv_cache_gib=0.25, tokenizer=tokenizer
        )
        request.addfinalizer(engine.close)  # also when an assertion fails first (a second close does nothing)
    with Sandbox(SandboxConfig(isolation=Isolation.auto, workers=1)) as sandbox, Verifier(timeout_s=10) as judge:
        for name, protocol in protocols(tokenizer).items():
            t = rollout(engine, protocol, sandbox)
            ids, mask = target(protocol, tokenizer)
            assert t.token_ids == ids, name  # the exact ids, the tool segment included
            assert t.response_mask == mask[len(t.prompt_ids) :]
            assert [c.arguments["code"] for c in t.tool_calls] == [CODE]
            assert t.tool_outputs[0].status == "ok" and t.tool_outputs[0].text == "42"
            assert t.stop_reason == "answered" and t.turns == 2
            [model_turn, tool, _] = [text for _, text in t.segments]
            if name == "retool_tags":  # the stop string ended inside `>\n\n`: the turn keeps what was sampled
                assert model_turn == TAGGED_TURN and tool == "\n<interpreter>\n42\n</interpreter>\n"
            [score] = score_batch([t.response()], RewardConfig(), judge)
            assert score.correct and score.extracted == "42"
    if engine_name == "vllm":
        from vllm.distributed import parallel_state

        # shut down now, not by the collector at some later moment, when its finalizer would tear down the
        # process-wide groups of an engine built since (CI: another test file's engine, in this pytest worker)
        engine.close()
        assert not parallel_state.model_parallel_is_initialized()


# ------------------------------------------------------------------ the commands, with the model folder


@pytest.fixture(scope="module")
def traces(tmp_path_factory) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from tests.unit.test_traces import retool_sft_rows

    path = tmp_path_factory.mktemp("traces") / "train_2000.parquet"
    pq.write_table(pa.Table.from_pylist(retool_sft_rows() * 2), path)
    return path


REAL = [
    "recipe=dapo_smoke",
    "model.accelerate=false",
    "model.max_context_tokens=640",
    "rollout.max_prompt_tokens=512",
    "data.synthetic.num_examples=40",
    "data.dev_size=4",
]


@pytest.mark.parametrize(
    ("protocol", "train_engine", "eval_engine"), [("retool_tags", "hf", "vllm"), ("chat_tool", "vllm", "hf")]
)
def test_sft_train_eval_on_a_real_vocabulary(
    protocol, train_engine, eval_engine, random_model, traces, tmp_path
) -> None:
    """SFT names the model and protocol; train (trainer.init_from) and eval (ckpt=) name neither: they run with
    the checkpoint's own tokenizer, chat template and protocol, and their checkpoints carry them on."""
    common = [*REAL, f"model.name_or_path={random_model}", f"protocol={protocol}"]
    vllm = ["rollout.vllm_kv_cache_gib=0.25", "rollout.vllm_enforce_eager=true"]  # each start compiles again: 10-20 s
    run_retool(
        "sft", *common, f"sft.traces_file={traces}", "sft.steps=3", "sft.batch_size=2", "sft.warmup_steps=0",
        "sft.log_every=1", "hydra.run.dir=sft", cwd=tmp_path, check=True,
    )  # fmt: skip
    losses = [row["loss"] for row in read_jsonl(tmp_path / "sft" / "metrics.jsonl")]
    assert len(losses) == 3 and all(loss > 0 for loss in losses)
    run_retool(
        "train", *REAL, f"rollout={train_engine}", *vllm, "trainer.init_from=sft", "trainer.total_steps=2",
        "trainer.save_every=2", "trainer.questions_per_step=2", "rollout.group_size=2",
        "rollout.max_response_tokens=24", "trainer.keep_rollouts=2", "hydra.run.dir=train", cwd=tmp_path, check=True,
    )  # fmt: skip
    rows = read_jsonl(tmp_path / "train" / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2] and all(r["rollout/response_tokens"] > 0 for r in rows)
    checkpoint = tmp_path / "train" / "checkpoints" / "step_2"
    record = json.loads((checkpoint / "retool_checkpoint.json").read_text())
    assert record["base_model"] == str(random_model) and record["protocol"]["name"] == protocol
    saved = AutoTokenizer.from_pretrained(checkpoint)
    assert saved.get_vocab() == load_real_tokenizer("qwen2.5-instruct").get_vocab()  # the real vocabulary, not tiny's
    assert saved.chat_template == load_real_tokenizer("qwen2.5-instruct").chat_template
    run_retool(
        "eval", *REAL, f"rollout={eval_engine}", *vllm, "ckpt=train", "benchmark.max_problems=2",
        "benchmark.n_samples=2", "benchmark.max_response_tokens=24", "eval.bootstrap=100", "hydra.run.dir=eval",
        cwd=tmp_path, check=True,
    )  # fmt: skip
    results = json.loads((tmp_path / "eval" / "results.json").read_text())
    assert results["protocol"]["engine"] == eval_engine and results["protocol"]["tool_protocol"] == protocol
    samples = read_jsonl(tmp_path / "eval" / "samples.jsonl")
    assert len(samples) == 4 and all(s["prompt_tokens"] > 0 for s in samples)
