"""The tokenizer check at load: a tokenizer that loads but reads text wrong is refused before any work, with
the reason and the fix; the real tokenizers pass."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from retool_cli.config import ModelConfig
from retool_cli.errors import ConfigError
from retool_cli.model.loading import load_tokenizer
from tests.helpers import run_retool
from tests.real_models import TEMPLATES, tokenizer_folder


def copy_of(name: str, tmp_path: Path) -> Path:
    out = tmp_path / name
    shutil.copytree(tokenizer_folder(name), out)
    return out


def edit_json(path: Path, change) -> None:
    data = json.loads(path.read_text(encoding="utf-8"))
    change(data)
    path.write_text(json.dumps(data), encoding="utf-8")


def skip_where_transformers_reads_deepseek_right() -> None:
    import transformers
    from packaging.version import Version

    if Version(transformers.__version__) >= Version("5.24"):  # follows tokenizer.json: nothing to refuse
        pytest.skip(f"transformers {transformers.__version__} reads DeepSeek-R1-Distill's tokenizer folder right")


def test_deepseek_tokenizer_only_folder_is_refused_with_the_fix(tmp_path) -> None:
    skip_where_transformers_reads_deepseek_right()
    folder = tokenizer_folder("deepseek-r1-distill-qwen")  # names LlamaTokenizerFast, no config.json beside it
    with pytest.raises(ConfigError) as caught:
        load_tokenizer(ModelConfig(name_or_path=str(folder)))
    message = str(caught.value)
    assert "decodes as 'Whatis2+2?Answer:4'" in message
    assert "model.tokenizer_class=PreTrainedTokenizerFast" in message and "config.json" in message
    # the markers it misreads are the same misreading: one fix, and no claim that a single piece is several
    assert "lack special tokens" not in message and "split into 1 " not in message
    # each fix the message names works
    fixed = load_tokenizer(ModelConfig(name_or_path=str(folder), tokenizer_class="PreTrainedTokenizerFast"))
    assert fixed.encode("What is 2+2?", add_special_tokens=False)[:4] == [3838, 374, 220, 17]
    beside = copy_of("deepseek-r1-distill-qwen", tmp_path)
    (beside / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
    assert load_tokenizer(ModelConfig(name_or_path=str(beside))).decode([3838, 374]) == "What is"


# transformers 5 rebuilds a Qwen2Tokenizer from the vocabulary and merges alone, so a tokenizer.json broken on
# purpose is read as it is with model.tokenizer_class=PreTrainedTokenizerFast
AS_IS = "PreTrainedTokenizerFast"


def test_a_normalizer_that_changes_text_is_refused(tmp_path) -> None:
    folder = copy_of("qwen2.5-instruct", tmp_path)
    edit_json(folder / "tokenizer.json", lambda t: t.update(normalizer={"type": "Lowercase"}))
    with pytest.raises(
        ConfigError, match=r"'What is 2\+2\? Answer: 4' encodes to .* decodes as 'what is 2\+2\? answer: 4'"
    ):
        load_tokenizer(ModelConfig(name_or_path=str(folder), tokenizer_class=AS_IS))


def test_a_missing_decoder_is_refused(tmp_path) -> None:
    folder = copy_of("qwen3", tmp_path)
    edit_json(folder / "tokenizer.json", lambda t: t.update(decoder=None))  # byte-level pieces shown raw ("Ġ")
    with pytest.raises(
        ConfigError,
        match="(?s)decodes as 'What Ġis .*model.tokenizer_class=PreTrainedTokenizerFast reads these files wrong",
    ):
        load_tokenizer(ModelConfig(name_or_path=str(folder), tokenizer_class=AS_IS))


def test_a_chat_marker_that_is_not_one_token_is_refused(tmp_path) -> None:
    folder = copy_of("qwen2.5-instruct", tmp_path)

    def drop_im_start(t: dict) -> None:
        t["added_tokens"] = [a for a in t["added_tokens"] if a["content"] != "<|im_start|>"]

    def drop_from_config(c: dict) -> None:  # the config's copies too, or transformers adds it back
        c["added_tokens_decoder"].pop("151644")
        c["additional_special_tokens"].remove("<|im_start|>")

    edit_json(folder / "tokenizer.json", drop_im_start)
    edit_json(folder / "tokenizer_config.json", drop_from_config)
    with pytest.raises(
        ConfigError,
        match=r"(?s)'<\|im_start\|>' \(a chat-template marker or eos/bos/pad\) is split into \d+ tokens.*lack special",
    ):
        load_tokenizer(ModelConfig(name_or_path=str(folder)))


def test_no_chat_template_is_refused_and_model_chat_template_fixes_it(tmp_path) -> None:
    folder = copy_of("qwen2.5-instruct", tmp_path)
    edit_json(folder / "tokenizer_config.json", lambda c: c.pop("chat_template"))
    (folder / "chat_template.jinja").unlink(missing_ok=True)
    with pytest.raises(ConfigError, match="(?s)it has no chat template.*model.chat_template=FILE.jinja"):
        load_tokenizer(ModelConfig(name_or_path=str(folder)))
    template = TEMPLATES / "Qwen-Qwen2.5-7B-Instruct.jinja"
    tokenizer = load_tokenizer(ModelConfig(name_or_path=str(folder), chat_template=str(template)))
    assert tokenizer.chat_template == template.read_text()


def test_bad_tokenizer_keys_name_the_key(tmp_path) -> None:
    folder = tokenizer_folder("qwen3")
    with pytest.raises(ConfigError, match="model.tokenizer_class='NoSuchTokenizer'"):
        load_tokenizer(ModelConfig(name_or_path=str(folder), tokenizer_class="NoSuchTokenizer"))
    with pytest.raises(ConfigError, match="model.chat_template=/no/such.jinja: no such file"):
        load_tokenizer(ModelConfig(name_or_path=str(folder), chat_template="/no/such.jinja"))


def test_the_command_line_refuses_before_any_work(tmp_path) -> None:
    skip_where_transformers_reads_deepseek_right()
    folder = tokenizer_folder("deepseek-r1-distill-qwen")
    proc = run_retool("sft", "recipe=dapo_smoke", f"model.name_or_path={folder}", "sft.steps=1", cwd=tmp_path)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1 and "does not read text right" in out and "Traceback" not in out
    assert not list(tmp_path.rglob("*.safetensors")) and not list(tmp_path.rglob(".hydra"))  # no run left


def test_an_engine_tokenizer_that_reads_differently_is_refused() -> None:
    from transformers import AutoTokenizer

    from retool_cli.model.tokenizer_check import check_same_tokenizer

    ours = load_tokenizer(ModelConfig(name_or_path=str(tokenizer_folder("qwen2.5-instruct"))))
    check_same_tokenizer(ours, AutoTokenizer.from_pretrained(tokenizer_folder("qwen2.5-instruct")), "vLLM")
    with pytest.raises(ConfigError, match="reads text differently"):  # Qwen3 has <think> as one token
        check_same_tokenizer(ours, AutoTokenizer.from_pretrained(tokenizer_folder("qwen3")), "vLLM")
    skip_where_transformers_reads_deepseek_right()
    spaceless = AutoTokenizer.from_pretrained(tokenizer_folder("deepseek-r1-distill-qwen"))  # as vLLM would load it
    with pytest.raises(ConfigError, match=r"vLLM loaded a tokenizer that reads text differently.*\[1639, 3605"):
        check_same_tokenizer(ours, spaceless, "vLLM")


NO_SYSTEM_TEMPLATE = (  # Gemma's way: a system message is an error
    "{% for m in messages %}{% if m['role'] == 'system' %}{{ raise_exception('System role not supported') }}"
    "{% endif %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def test_a_template_that_cannot_render_a_system_message_is_refused_with_the_fix(tmp_path) -> None:
    template = tmp_path / "no_system.jinja"
    template.write_text(NO_SYSTEM_TEMPLATE)
    cfg = ModelConfig(name_or_path=str(tokenizer_folder("qwen2.5-instruct")), chat_template=str(template))
    with pytest.raises(
        ConfigError, match="(?s)cannot render a system prompt.*System role not supported.*model.chat_template"
    ):
        load_tokenizer(cfg)


def test_a_template_that_fails_on_the_protocols_conversation_is_a_start_up_error(tmp_path) -> None:
    """Renders a system prompt and a question, fails on a tool message: chat_tool refuses it when it is built,
    naming the protocol and the fix; retool_tags (no tool messages) builds."""
    from retool_cli.config import ProtocolConfig, ProtocolName
    from retool_cli.env.protocol import build_protocol

    template = tmp_path / "no_tool.jinja"
    template.write_text(
        "{% for m in messages %}{% if m['role'] == 'tool' %}{{ raise_exception('no tool role') }}{% endif %}"
        "<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    tokenizer = load_tokenizer(
        ModelConfig(name_or_path=str(tokenizer_folder("qwen2.5-instruct")), chat_template=str(template))
    )
    with pytest.raises(ConfigError, match=r"protocol=chat_tool: .*no tool role.*model.chat_template"):
        build_protocol(ProtocolConfig(name=ProtocolName.chat_tool), tokenizer)
    assert build_protocol(ProtocolConfig(name=ProtocolName.retool_tags), tokenizer).prompt_ids("Q")
