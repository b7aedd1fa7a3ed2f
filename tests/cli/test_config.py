"""Every primary config, group option and recipe composes and converts to the typed config."""

from __future__ import annotations

import enum
import re

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.errors import ConfigCompositionException
from omegaconf import DictConfig, OmegaConf

from retool_cli.cli import hydra_argv
from retool_cli.compose import CONF_DIR, RECIPES_DIR, register_configs, to_config
from retool_cli.config import DataSource, RetoolConfig
from retool_cli.errors import ConfigError

PRIMARY = sorted(p.stem for p in CONF_DIR.glob("*.yaml") if p.stem not in ("hydra_settings", "command_defaults"))
DATA_OPTIONS = sorted(p.stem for p in (CONF_DIR / "data").glob("*.yaml"))
RECIPES = sorted(p.stem for p in RECIPES_DIR.glob("*.yaml"))
BENCHMARKS = sorted(p.stem for p in (CONF_DIR / "benchmark").glob("*.yaml"))
GROUP_OPTIONS = [
    (group.name, option.stem)
    for group in sorted(CONF_DIR.iterdir())
    if group.is_dir() and group.name not in ("hydra", "recipe")
    for option in sorted(group.glob("*.yaml"))
]


def composed(command: str, overrides: list[str]) -> RetoolConfig:
    return to_config(composed_raw(command, overrides))


def composed_raw(command: str, overrides: list[str]) -> DictConfig:
    register_configs()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(config_name=command, overrides=overrides)


def leaves(node: object, prefix: str = "") -> dict[str, object]:
    """{dotted key: value} of a nested dict."""
    if not isinstance(node, dict):
        return {prefix: node}
    return {k: v for key, child in node.items() for k, v in leaves(child, f"{prefix}.{key}" if prefix else key).items()}


def test_there_is_something_to_check() -> None:
    assert {"prepare", "eval"} <= set(PRIMARY)
    assert {"aime24", "aime25", "math500", "smoke", "file"} <= set(BENCHMARKS)
    assert {"synthetic", "dapo_math_17k", "aime24", "aime25", "math500", "file"} <= set(DATA_OPTIONS)
    assert {"dapo_smoke", "retool_qwen2.5_7b"} <= set(RECIPES)


@pytest.mark.parametrize("command", PRIMARY)
@pytest.mark.parametrize("option", DATA_OPTIONS)
def test_every_data_option_composes(command: str, option: str) -> None:
    overrides = [f"data={option}"] + (["data.path=x.jsonl"] if option == "file" else [])
    cfg = composed(command, overrides)
    assert cfg.data.source is DataSource[option]
    assert cfg.command == command
    if cfg.data.hub_id:  # hub sources are pinned to a commit, so a rerun reads the same rows
        assert re.fullmatch(r"[0-9a-f]{40}", cfg.data.revision), (option, cfg.data.revision)


@pytest.mark.parametrize("command", PRIMARY)
@pytest.mark.parametrize("recipe", RECIPES)
def test_every_recipe_composes_for_every_command(command: str, recipe: str) -> None:
    cfg = composed(command, [f"recipe={recipe}"])
    assert isinstance(cfg, RetoolConfig)


@pytest.mark.parametrize(
    ("group", "options"), [("protocol", ["retool_tags", "chat_tool", "none"]), ("rollout", ["hf", "vllm"])]
)
def test_protocol_and_rollout_groups(group: str, options: list[str]) -> None:
    for option in options:
        cfg = composed("prepare", [f"{group}={option}"])
        value = cfg.protocol.name.value if group == "protocol" else cfg.rollout.engine.value
        assert value == option


@pytest.mark.parametrize("option", BENCHMARKS)
def test_every_benchmark_option_composes(option: str) -> None:
    overrides = [f"benchmark={option}"] + (["benchmark.data.path=x.jsonl"] if option == "file" else [])
    cfg = composed("eval", overrides)
    assert cfg.benchmark.name == option
    assert (cfg.benchmark.data is None) == (option == "smoke")
    data = cfg.benchmark.data
    if data is not None and data.hub_id:
        assert re.fullmatch(r"[0-9a-f]{40}", data.revision), (option, data.revision)


def test_recipe_values_and_command_line_wins() -> None:
    smoke = composed("prepare", ["recipe=dapo_smoke"])
    assert smoke.data.source is DataSource.synthetic and smoke.model.device == "cpu"
    big = composed("prepare", ["recipe=retool_qwen2.5_7b"])
    assert big.data.source is DataSource.dapo_math_17k and big.rollout.group_size == 16
    # an explicit override beats the recipe, whatever the order on the command line
    assert composed("prepare", ["data.dev_size=3", "recipe=dapo_smoke"]).data.dev_size == 3
    assert composed("prepare", ["recipe=retool_qwen2.5_7b", "data=aime24"]).data.source is DataSource.aime24


def test_there_are_groups_to_check() -> None:
    assert {"data", "protocol", "rollout", "benchmark"} <= {group for group, _ in GROUP_OPTIONS}


@pytest.mark.parametrize("command", ["eval", "train"])
@pytest.mark.parametrize("recipe", RECIPES)
@pytest.mark.parametrize(("group", "option"), GROUP_OPTIONS)
def test_a_group_chosen_on_the_command_line_beats_the_recipe(
    command: str, recipe: str, group: str, option: str
) -> None:
    """`recipe=R GROUP=OPTION`: every value the option's file sets is in the composed config, whatever the
    recipe says about that section (the recipe's `rollout.engine: hf` used to win over `rollout=vllm`)."""
    chosen = leaves(OmegaConf.to_container(OmegaConf.load(CONF_DIR / group / f"{option}.yaml")))
    required = [f"{group}.{key}=x.jsonl" for key, value in chosen.items() if value == "???"]
    cfg = composed_raw(command, [f"recipe={recipe}", f"{group}={option}", *required])
    got = leaves(OmegaConf.to_container(cfg[group], resolve=True, enum_to_str=True))
    assert {k: got[k] for k in chosen if chosen[k] != "???"} == {k: v for k, v in chosen.items() if v != "???"}
    try:
        to_config(cfg)  # and it is a valid config...
    except ConfigError as exc:  # ...or refused for the one reason a group may make it invalid: the smoke
        # recipe's 512-token context cannot hold a benchmark's 8k-16k response budget
        assert recipe == "dapo_smoke" and group == "benchmark" and "model.max_context_tokens" in str(exc)


def test_command_line_value_beats_group_and_recipe_and_recipe_beats_defaults() -> None:
    cfg = composed(
        "eval", ["benchmark.n_samples=3", "recipe=dapo_smoke", "benchmark=aime24", "benchmark.max_response_tokens=200"]
    )
    assert (cfg.benchmark.name, cfg.benchmark.n_samples, cfg.benchmark.temperature) == ("aime24", 3, 0.6)
    # without a command-line choice, the recipe's values stand over the command's default options
    cfg = composed("eval", ["recipe=dapo_smoke"])
    assert (cfg.benchmark.name, cfg.benchmark.n_samples, cfg.rollout.group_size) == ("smoke", 8, 8)
    assert cfg.model.name_or_path == "tiny" and cfg.data.dev_size == 200
    # the recipe's own values for a section survive where the chosen option says nothing
    cfg = composed("train", ["recipe=dapo_smoke", "rollout=vllm"])
    assert cfg.rollout.engine.value == "vllm" and cfg.rollout.group_size == 8 and not cfg.rollout.overlap_sandbox


def test_cross_field_checks_run_on_conversion() -> None:
    with pytest.raises(ConfigError, match="data.dev_size: must be >= 0"):
        composed("prepare", ["data.dev_size=-1"])
    with pytest.raises(ConfigError, match="rollout.top_p"):
        composed("prepare", ["rollout.top_p=0"])


def test_hydra_argv_moves_flags_before_overrides() -> None:
    assert hydra_argv(["a=1", "-m", "b=2,3"]) == ["-m", "a=1", "b=2,3"]
    assert hydra_argv(["a=1", "--cfg", "job", "b=2"]) == ["--cfg", "job", "a=1", "b=2"]
    assert hydra_argv(["a=1", "--info", "b=2"]) == ["--info", "a=1", "b=2"]
    assert hydra_argv(["--info", "defaults", "a=1"]) == ["--info", "defaults", "a=1"]
    assert hydra_argv(["a=1", "hydra/launcher=joblib", "--multirun"]) == [
        "--multirun",
        "a=1",
        "hydra/launcher=joblib",
    ]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["trainer.fsdp=true", "model.lora_rank=4"], "trainer.fsdp: LoRA"),
        (["trainer.fsdp=true", "rollout.dtype=bfloat16"], "trainer.fsdp: LoRA"),
        (["model.lora_rank=-1"], "model.lora_rank: must be >= 0"),
        (["trainer.max_staleness=-1"], "trainer.max_staleness: must be >= 0"),
        (
            [
                "trainer.max_staleness=1",
                "rollout=vllm",
                "rollout.placement=separate",
                "rollout.vllm_tensor_parallel_size=2",
            ],
            "rollout.vllm_tensor_parallel_size: 2 with rollout.placement=separate: an engine process holds",
        ),
        (["rollout.partial=true"], "rollout.partial: partial rollouts continue a trajectory"),
        (["rollout.partial=true", "trainer.max_staleness=1", "rollout.loop=async"], "rollout.loop: async: partial"),
        (["rollout.partial_turns=0"], "rollout.partial_turns: must be >= 1"),
        (["rollout.partial=true", "rollout.partial_tokens=0"], "rollout.partial_tokens: must be >= 1"),
        (["rollout.partial_tokens=64"], "rollout.partial_tokens: needs rollout.partial=true"),
        (["rollout.placement=separate"], "rollout.placement: separate puts the overlapped sampler's engines"),
        (["rollout.engine_processes=0"], "rollout.engine_processes: must be >= 1"),
        (["rollout.engine_threads=0"], "rollout.engine_threads: must be >= 1"),
        (["rollout.engine_restarts=-1"], "rollout.engine_restarts: must be >= 0"),
        (["rollout.weight_bucket_mb=0"], "rollout.weight_bucket_mb: must be > 0"),
    ],
)
def test_precision_lora_and_fsdp_options_fail_before_any_work(overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        composed("train", overrides)


def choice_fields() -> list[tuple[str, type, str]]:
    """(dotted key, annotation, help) of every field of every section of the schema."""
    from dataclasses import fields, is_dataclass
    from typing import get_type_hints

    found = []
    for section in fields(RetoolConfig):
        default = getattr(RetoolConfig(), section.name)
        if not is_dataclass(default):
            continue
        hints = get_type_hints(type(default))
        found += [(f"{section.name}.{f.name}", hints[f.name], f.metadata.get("help", "")) for f in fields(default)]
    return found


# A string field whose help lists alternatives but that takes more than those (why, per key).
OPEN_STRINGS = {"model.device": "cuda:N names one device"}


def test_every_choice_field_is_an_enum_that_refuses_another_value_naming_the_key() -> None:
    """A field documented as `a | b` is an enum (OmegaConf refuses anything else at composition, naming the
    key and the choices), not a string checked by hand in one place and compared by spelling in others."""
    hand_checked = [
        key
        for key, kind, help in choice_fields()
        if not (isinstance(kind, type) and issubclass(kind, enum.Enum)) and " | " in help and key not in OPEN_STRINGS
    ]
    assert not hand_checked, f"choices spelled as strings: {hand_checked}"
    enums = [(key, kind) for key, kind, _ in choice_fields() if isinstance(kind, type) and issubclass(kind, enum.Enum)]
    assert len(enums) >= 19
    for key, _ in enums:
        with pytest.raises(ConfigCompositionException) as refused:
            composed_raw("train", [f"{key}=no_such_choice"])
        why = str(refused.value.__cause__)
        assert re.search(rf"(?s)Invalid value 'no_such_choice'.*full_key: {re.escape(key)}\n", why), why


def test_resume_is_a_bool_in_every_section() -> None:
    kinds = {key: kind for key, kind, _ in choice_fields() if key.endswith(".resume")}
    assert kinds == {"trainer.resume": bool, "sft.resume": bool, "eval.resume": bool}


# ------------------------------------------------------------------ budgets


def test_the_7b_recipe_gives_long_reasoning_its_whole_budget() -> None:
    train = composed("train", ["recipe=retool_qwen2.5_7b"])
    assert train.rollout.max_tokens_per_turn is None and train.rollout.max_response_tokens == 16384
    assert train.context_tokens() == 2048 + 16384 and train.rollout.engine.value == "vllm"
    ev = composed("eval", ["recipe=retool_qwen2.5_7b"])
    b = ev.benchmark
    assert (b.name, b.n_samples, b.temperature, b.top_p, b.max_response_tokens) == (
        "aime24",
        32,
        0.6,
        0.95,
        16384,
    )
    assert composed("eval", ["recipe=retool_qwen2.5_7b", "benchmark=aime25"]).benchmark.name == "aime25"


@pytest.mark.parametrize(
    ("command", "overrides", "named"),
    [
        (
            "train",
            ["recipe=retool_qwen2.5_7b", "rollout.max_tokens_per_turn=1024"],
            ["rollout.max_tokens_per_turn", "rollout.max_turns=8", "rollout.max_response_tokens=16384"],
        ),
        ("train", ["recipe=dapo_smoke", "rollout.max_tokens_per_turn=16"], ["rollout.max_tokens_per_turn"]),
        (
            "train",
            ["recipe=retool_qwen2.5_7b", "model.max_context_tokens=8192"],
            ["model.max_context_tokens", "rollout.max_prompt_tokens=2048", "rollout.max_response_tokens=16384"],
        ),
        (
            "eval",
            ["recipe=dapo_smoke", "benchmark=aime24"],
            ["model.max_context_tokens", "benchmark.max_response_tokens"],
        ),
        (
            "train",
            ["recipe=dapo_smoke", "trainer.eval_every=5", "benchmark.max_response_tokens=400"],
            ["model.max_context_tokens", "benchmark.max_response_tokens=400"],
        ),
        (
            "filter-pass-rate",
            ["rollout.max_response_tokens=5000", "model.max_context_tokens=4096"],
            ["model.max_context_tokens", "rollout.max_response_tokens=5000"],
        ),
    ],
)
def test_inconsistent_budgets_are_refused_naming_both_keys(
    command: str, overrides: list[str], named: list[str]
) -> None:
    with pytest.raises(ConfigError) as refused:
        composed(command, overrides)
    assert all(key in str(refused.value) for key in named), str(refused.value)


def test_an_unset_context_is_sized_to_what_the_command_samples() -> None:
    assert composed("eval", []).context_tokens() == 1024 + 256  # prompt + the smoke benchmark's budget
    assert composed("train", ["rollout.max_response_tokens=3000"]).context_tokens() == 1024 + 3000
    train = composed("train", ["trainer.eval_every=2", "benchmark=math500"])
    assert train.context_tokens() == 1024 + 8192  # the periodic eval's budget is the larger one


# ------------------------------------------------------------------ every value checked at composition

# Numeric keys where a negative value means something (a seed, a penalty, a signed weight, an id range).
NEGATIVE_ALLOWED = {"seed", "sandbox.seed", "reward.format_weight", "trainer.entropy_coef", "sandbox.uid_base"}


def numeric_keys(command: str) -> list[str]:
    flat = leaves(OmegaConf.to_container(composed_raw(command, []), resolve=False))
    return sorted(k for k, v in flat.items() if isinstance(v, (int, float)) and not isinstance(v, bool))


def test_every_numeric_key_refuses_a_negative_value_naming_the_key() -> None:
    """A kind of mistake, not a list of them: any count, size, rate, time or coefficient set below zero fails
    at composition (before a model loads), with the key in the message. A key added later without its check
    fails here. (Every command composes the same schema; train's has every section in use.)"""
    raw = composed_raw("train", [])
    keys = [k for k in numeric_keys("train") if k not in NEGATIVE_ALLOWED]
    assert len(keys) > 60
    unchecked, misnamed = [], []
    for key in keys:
        changed = raw.copy()
        OmegaConf.update(changed, key, -3)  # as `key=-3` on the command line, without composing again
        try:
            to_config(changed)
        except ConfigError as exc:
            if not str(exc).startswith(f"{key}:"):
                misnamed.append((key, str(exc)))
        else:
            unchecked.append(key)
    assert not unchecked, f"negative values accepted: {unchecked}"
    assert not misnamed, f"errors that name another key: {misnamed}"


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        (["trainer.clip_low=1.5"], "trainer.clip_low"),
        (["trainer.grad_clip=0"], "trainer.grad_clip"),
        (["trainer.dual_clip=0.5"], "trainer.dual_clip"),
        (["sft.lr=0"], "sft.lr"),
        (["sft.log_every=0"], "sft.log_every"),
        (["shard.count=0"], "shard.count"),
        (["trainer.nnodes=2", "trainer.node_rank=2"], "trainer.node_rank"),
    ],
)
def test_out_of_range_values_name_their_key(overrides: list[str], key: str) -> None:
    with pytest.raises(ConfigError, match=f"^{re.escape(key)}:"):
        composed("train", overrides)


@pytest.mark.parametrize(
    "override",
    ["+trainer.totl_steps=3", "+rollout.groupsize=4", "+learning_rate=1e-5", "+model.lora.rank=8"],
)
def test_a_key_the_schema_lacks_is_refused_even_when_added_with_plus(override: str) -> None:
    """Hydra's own hint for a typo is `+key=value`, which adds the key: it would be recorded and ignored."""
    key = override[1:].split("=")[0]
    with pytest.raises(ConfigError, match=re.escape(key.rsplit(".", 1)[0] if "lora." in key else key)):
        composed("train", [override])


def test_the_unknown_key_message_suggests_the_close_one() -> None:
    with pytest.raises(ConfigError, match=r"trainer.totl_steps: not a config key \(did you mean trainer.total_steps"):
        composed("train", ["+trainer.totl_steps=3"])


@pytest.mark.parametrize(
    ("overrides", "key"),
    [(["rollout.group_size=1"], "rollout.group_size"), (["rollout.temperature=0"], "rollout.temperature")],
)
def test_train_refuses_settings_that_learn_nothing_unless_allowed(overrides: list[str], key: str) -> None:
    with pytest.raises(ConfigError, match=f"^{re.escape(key)}:.*learns nothing"):
        composed("train", overrides)
    assert composed("train", [*overrides, "trainer.allow_no_learning=true"]).trainer.allow_no_learning
    composed("eval", overrides)  # sampling without training: greedy and one sample are fine


@pytest.mark.parametrize(
    ("overrides", "idle"),
    [
        (["rollout.engine_processes=2", "rollout.engine_restarts=0"], ["engine_processes", "engine_restarts"]),
        (
            ["trainer.max_staleness=1", "rollout.engine_threads=2", "rollout.weight_bucket_mb=8"],
            ["engine_threads", "weight_bucket_mb"],
        ),
        (["trainer.max_staleness=1", "rollout.partial_turns=2"], ["partial_turns"]),
        (["trainer.max_staleness=1", "rollout.placement=separate", "rollout.engine_processes=2"], []),
        (["trainer.max_staleness=1", "rollout.partial=true", "rollout.partial_turns=2"], []),
        (["rollout.engine_processes=1", "rollout.partial_turns=1"], []),  # the defaults, typed: nothing to say
    ],
)
def test_overlap_keys_that_do_nothing_in_a_run_are_named(overrides: list[str], idle: list[str]) -> None:
    """A key of engine processes or partial rollouts set in a run without them is named (train logs the notes),
    and only there; a recipe may set them, so a note, not an error."""
    notes = composed("train", ["recipe=dapo_smoke", *overrides]).idle_overlap_settings()
    assert [re.match(r"rollout\.(\w+)=", note)[1] for note in notes] == idle
    assert all("does nothing here" in note for note in notes)
    assert composed("sft", ["recipe=dapo_smoke", *overrides]).idle_overlap_settings() == []
