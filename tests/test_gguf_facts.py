"""The GGUF probe (``harness/probes/gguf_facts.py``): fixture facts equal their specs,
tensor bytes add up, per-architecture rules of the pinned llama.cpp, and damaged files.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from pathlib import Path

import gguf
import pytest

from harness import modelgen
from harness.errors import ModelFileError
from harness.facts.model_facts import ModelFacts
from harness.modelgen.fixture_data import load_all
from harness.modelgen.specs import ModelShape
from harness.probes.gguf_facts import read_model_facts
from harness.probes.gguf_header import NUM_LOOPS_KEY, RECURRENT_LAYERS_KEY

K = gguf.Keys
SPECS = load_all()[0]
SERVING = tuple(name for name, spec in SPECS.items() if spec.shape is not None)


def shape(name: str) -> ModelShape:
    spec = SPECS[name].shape
    assert spec is not None
    return spec


@pytest.fixture(scope="module")
def facts_of(fixture_set: modelgen.FixtureSet) -> Mapping[str, ModelFacts]:
    return {name: read_model_facts(fixture_set.model(name)) for name in SERVING}


# --- the fixtures -----------------------------------------------------------------------


@pytest.mark.parametrize("name", SERVING)
def test_facts_equal_the_spec(name: str, facts_of: Mapping[str, ModelFacts],
                              fixture_set: modelgen.FixtureSet) -> None:
    spec, facts = shape(name), facts_of[name]
    assert facts.path == str(fixture_set.model(name))
    assert facts.file_size == fixture_set.model(name).stat().st_size
    assert facts.architecture == spec.architecture.value
    assert (facts.block_count, facts.context_length, facts.embedding_length) == (
        spec.block_count, spec.context_length, spec.embedding_length)
    assert facts.head_count == spec.head_count
    assert facts.head_count_kv == (spec.head_count_kv,) * spec.block_count
    assert facts.key_length == facts.value_length == spec.key_length
    assert (facts.expert_count, facts.expert_used_count) == (
        spec.expert_count, spec.expert_used_count)
    assert facts.nextn_predict_layers == spec.nextn_predict_layers
    assert facts.sliding_window == spec.sliding_window
    assert facts.vocab_size == {"spm-bytes": 269, "spm-foreign": 309}[spec.vocab.value]
    assert facts.kv_unmodelled is None
    assert (facts.recurrent_layers, facts.shared_kv_layers, facts.loop_count) == ((), 0, 1)


def test_gemma2_windows_every_other_layer(facts_of: Mapping[str, ModelFacts]) -> None:
    # load_swa_pattern(ml, 2): layer 0 windowed, layer 1 full
    assert facts_of["swa"].swa_layers == (True, False)
    assert not any(facts_of["dense"].swa_layers)


@pytest.mark.parametrize("name", SERVING)
def test_layer_bytes_add_up_to_the_tensor_data(name: str, facts_of: Mapping[str, ModelFacts],
                                               fixture_set: modelgen.FixtureSet) -> None:
    facts = facts_of[name]
    reader = gguf.GGUFReader(fixture_set.model(name))
    tensor_bytes = sum(int(t.n_bytes) for t in reader.tensors)
    assert len(facts.layer_bytes) == facts.block_count
    assert [layer.index for layer in facts.layer_bytes] == list(range(facts.block_count))
    assert sum(layer.total for layer in facts.layer_bytes) + facts.non_layer_bytes == tensor_bytes
    assert tensor_bytes <= facts.file_size - reader.data_offset
    assert all(layer.other > 0 for layer in facts.layer_bytes)  # attention and norms


def test_the_split_follows_the_offload_flags(facts_of: Mapping[str, ModelFacts]) -> None:
    dense, moe, mtp = facts_of["dense"], facts_of["moe"], facts_of["mtp"]
    assert all(la.expert == 0 and la.dense_ffn > 0 for la in dense.layer_bytes)
    assert all(la.expert > 0 and la.dense_ffn == 0 for la in moe.layer_bytes)
    # glm4moe: block 0 dense; blocks 1 and 2 (the MTP block) MoE with one shared expert
    first, *moe_blocks = mtp.layer_bytes
    assert first.expert == 0
    assert first.dense_ffn > 0
    assert all(la.expert > 0 and la.dense_ffn > 0 for la in moe_blocks)
    # the MTP block's nextn.* tensors count as its own "other"
    assert mtp.layer_bytes[2].other > mtp.layer_bytes[1].other


# --- per-architecture rules, on header-only files ---------------------------------------


def write_header(path: Path, arch: str, entries: Mapping[str, object]) -> Path:
    """A GGUF with only a header: ``entries`` keys are gguf templates (``{arch}``)."""
    writer = gguf.GGUFWriter(path, arch)
    base: dict[str, object] = {K.LLM.BLOCK_COUNT: 8, K.LLM.CONTEXT_LENGTH: 8192,
                               K.LLM.EMBEDDING_LENGTH: 256, K.Attention.HEAD_COUNT: 8,
                               K.Attention.HEAD_COUNT_KV: 2}
    for template, value in {**base, **entries}.items():
        key = template.format(arch=arch)
        if isinstance(value, bool):
            writer.add_bool(key, value)
        elif isinstance(value, int):
            writer.add_uint32(key, value)
        elif isinstance(value, str):
            writer.add_string(key, value)
        else:
            assert isinstance(value, list)
            writer.add_array(key, value)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    writer.close()
    return path


def header_facts(tmp_path: Path, arch: str, **entries: object) -> ModelFacts:
    named = {getattr(_KEYS, k): v for k, v in entries.items()}
    return read_model_facts(write_header(tmp_path / f"{arch}.gguf", arch, named))


class _KEYS:
    """Short names for the templates the rule tests set."""

    blocks = K.LLM.BLOCK_COUNT
    window = K.Attention.SLIDING_WINDOW
    pattern = K.Attention.SLIDING_WINDOW_PATTERN
    shared = K.Attention.SHARED_KV_LAYERS
    key_swa = K.Attention.KEY_LENGTH_SWA
    kv_heads = K.Attention.HEAD_COUNT_KV
    interval = K.LLM.FULL_ATTENTION_INTERVAL
    recurrent = RECURRENT_LAYERS_KEY
    loops = NUM_LOOPS_KEY
    mla = K.Attention.KEY_LENGTH_MLA
    conv = K.SSM.CONV_KERNEL
    inner = K.SSM.INNER_SIZE
    state = K.SSM.STATE_SIZE
    groups = K.SSM.GROUP_COUNT


def test_defaults_llama_cpp_assumes(tmp_path: Path) -> None:
    facts = header_facts(tmp_path, "llama")
    assert (facts.key_length, facts.value_length) == (32, 32)  # n_embd / n_head
    assert facts.head_count_kv == (2,) * 8
    assert facts.sliding_window is None
    assert facts.vocab_size == 0
    assert [la.total for la in facts.layer_bytes] == [0] * 8
    assert facts.non_layer_bytes == 0


def test_gemma3_windows_five_of_six_layers_when_it_has_a_window(tmp_path: Path) -> None:
    facts = header_facts(tmp_path, "gemma3", window=512, blocks=12)
    assert facts.sliding_window == 512
    assert facts.swa_layers == (True,) * 5 + (False,) + (True,) * 5 + (False,)
    assert header_facts(tmp_path, "gemma3").sliding_window is None


def test_an_integer_pattern_overrides_the_period(tmp_path: Path) -> None:
    facts = header_facts(tmp_path, "gemma3", window=512, pattern=3, blocks=6)
    assert facts.swa_layers == (True, True, False, True, True, False)


def test_cohere2moe_puts_the_dense_layer_first(tmp_path: Path) -> None:
    facts = header_facts(tmp_path, "cohere2moe", window=4096)
    assert facts.swa_layers == (False, True, True, True) * 2


def test_gemma2_assumes_a_4096_window(tmp_path: Path) -> None:
    assert header_facts(tmp_path, "gemma2").sliding_window == 4096


def test_llama4_is_chunked_unless_the_window_is_zero(tmp_path: Path) -> None:
    chunked = header_facts(tmp_path, "llama4")
    assert chunked.sliding_window == 8192
    assert chunked.swa_layers == (True, True, True, False) * 2
    assert header_facts(tmp_path, "llama4", window=0).sliding_window is None


def test_smallthinker_forces_its_window(tmp_path: Path) -> None:
    assert header_facts(tmp_path, "smallthinker", window=100).sliding_window == 4096


def test_exaone4_windows_only_the_64_layer_model(tmp_path: Path) -> None:
    assert header_facts(tmp_path, "exaone4", window=2048).sliding_window is None
    big = header_facts(tmp_path, "exaone4", blocks=64)
    assert big.sliding_window == 4096
    assert big.swa_layers[:4] == (True, True, True, False)


def test_gemma4_reads_its_pattern_shared_layers_and_swa_head_width(tmp_path: Path) -> None:
    pattern = [True, True, True, False] * 2
    facts = header_facts(tmp_path, "gemma4", window=1024, pattern=pattern, shared=2,
                         key_swa=64, kv_heads=[4, 4, 4, 1, 4, 4, 4, 1])
    assert facts.swa_layers == tuple(pattern)
    assert facts.shared_kv_layers == 2
    assert facts.key_length_swa == 64
    assert facts.head_count_kv == (4, 4, 4, 1, 4, 4, 4, 1)


def test_gemma4_without_its_pattern_names_the_missing_key(tmp_path: Path) -> None:
    with pytest.raises(ModelFileError, match=r"gemma4\.attention\.sliding_window_pattern"):
        header_facts(tmp_path, "gemma4", window=1024)


def test_gemma3n_shares_the_kv_of_layers_past_20(tmp_path: Path) -> None:
    assert header_facts(tmp_path, "gemma3n", window=512, blocks=30).shared_kv_layers == 10


def test_a_qwen35_hybrid_is_full_attention_every_fourth_layer(tmp_path: Path) -> None:
    facts = header_facts(tmp_path, "qwen35moe", interval=4, conv=4, inner=512, state=64,
                         groups=4)
    assert facts.full_attention_interval == 4
    assert facts.recurrent_layers == (True, True, True, False) * 2
    assert facts.ssm is not None
    assert (facts.ssm.conv_kernel, facts.ssm.inner_size, facts.ssm.state_size,
            facts.ssm.group_count) == (4, 512, 64, 4)
    listed = header_facts(tmp_path, "qwen3next", recurrent=[True, False] * 4, conv=4)
    assert listed.recurrent_layers == (True, False) * 4


def test_jamba_layers_without_kv_heads_are_recurrent(tmp_path: Path) -> None:
    facts = header_facts(tmp_path, "jamba", kv_heads=[0, 0, 0, 2, 0, 0, 0, 2], conv=4)
    assert facts.recurrent_layers == (True, True, True, False) * 2


def test_a_looped_model_reads_its_loop_count(tmp_path: Path) -> None:
    assert header_facts(tmp_path, "nanbeige", loops=3).loop_count == 3


@pytest.mark.parametrize(("arch", "entries", "reason"), [
    ("deepseek2", {"mla": 512}, "MLA"),
    ("rwkv7", {}, "not Mamba-shaped"),
    ("bert", {}, "no KV cache"),
], ids=["mla", "rwkv", "encoder"])
def test_memory_the_planner_does_not_model_is_marked(tmp_path: Path, arch: str,
                                                     entries: dict[str, object],
                                                     reason: str) -> None:
    facts = header_facts(tmp_path, arch, **entries)
    assert facts.kv_unmodelled is not None
    assert reason in facts.kv_unmodelled


# --- damaged and malformed files --------------------------------------------------------


def dense_bytes(fixture_set: modelgen.FixtureSet) -> bytes:
    return fixture_set.model("dense").read_bytes()


def field_offset(path: Path, key: str) -> int:
    field = gguf.GGUFReader(path).fields[key]
    return int(field.offset)


def test_the_corrupt_drafter_names_the_tensor_past_the_end(
        fixture_set: modelgen.FixtureSet) -> None:
    path = fixture_set.model("drafter-corrupt")
    with pytest.raises(ModelFileError) as raised:
        read_model_facts(path)
    message = str(raised.value)
    assert str(path) in message
    assert "tensor 'blk.0.ffn_gate.weight'" in message
    assert f"the file ends at offset {path.stat().st_size}" in message


def test_random_bytes_are_not_a_gguf(tmp_path: Path) -> None:
    path = tmp_path / "random.gguf"
    path.write_bytes(random.Random(7).randbytes(4096))
    with pytest.raises(ModelFileError, match=r"random\.gguf.*offset 0: .*GGUF magic"):
        read_model_facts(path)


def test_a_foreign_magic_is_named(tmp_path: Path, fixture_set: modelgen.FixtureSet) -> None:
    path = tmp_path / "ggml.bin"
    path.write_bytes(b"GGML" + dense_bytes(fixture_set)[4:])
    with pytest.raises(ModelFileError, match=r"ggml\.bin.*offset 0.*found b'GGML'"):
        read_model_facts(path)


def test_a_file_cut_inside_the_kv_section_names_the_key(
        tmp_path: Path, fixture_set: modelgen.FixtureSet) -> None:
    key = K.Tokenizer.SCORES
    cut = field_offset(fixture_set.model("dense"), key) + 40
    path = tmp_path / "cut.gguf"
    path.write_bytes(dense_bytes(fixture_set)[:cut])
    with pytest.raises(ModelFileError) as raised:
        read_model_facts(path)
    message = str(raised.value)
    assert "cut.gguf" in message
    assert f"key '{key}'" in message
    assert "the file ends inside" in message


def test_a_file_cut_inside_the_tensor_infos_names_the_tensor(
        tmp_path: Path, fixture_set: modelgen.FixtureSet) -> None:
    reader = gguf.GGUFReader(fixture_set.model("dense"))
    info = reader.tensors[3].field
    path = tmp_path / "infos.gguf"
    path.write_bytes(dense_bytes(fixture_set)[:int(info.offset) + 12])
    with pytest.raises(ModelFileError, match=r"infos\.gguf.*offset \d+: the file ends inside "
                                             r"the name of tensor info #3"):
        read_model_facts(path)


def test_an_empty_or_missing_file(tmp_path: Path) -> None:
    empty = tmp_path / "empty.gguf"
    empty.write_bytes(b"")
    with pytest.raises(ModelFileError, match=r"empty\.gguf: the file is empty"):
        read_model_facts(empty)
    with pytest.raises(ModelFileError, match=r"absent\.gguf: cannot read"):
        read_model_facts(tmp_path / "absent.gguf")


def test_a_required_key_of_the_wrong_type_names_key_and_offset(tmp_path: Path) -> None:
    path = write_header(tmp_path / "typed.gguf", "llama", {K.LLM.BLOCK_COUNT: "two"})
    offset = field_offset(path, "llama.block_count")
    with pytest.raises(ModelFileError, match=rf"typed\.gguf: GGUF key 'llama\.block_count' at "
                                             rf"offset {offset} holds STRING, expected an "
                                             r"integer"):
        read_model_facts(path)


def test_a_missing_required_key_is_named(tmp_path: Path) -> None:
    writer = gguf.GGUFWriter(tmp_path / "bare.gguf", "llama")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    writer.close()
    with pytest.raises(ModelFileError, match=r"bare\.gguf: GGUF key 'llama\.block_count' is "
                                             "missing"):
        read_model_facts(tmp_path / "bare.gguf")


def test_an_impossible_block_count_is_refused(tmp_path: Path) -> None:
    path = write_header(tmp_path / "blocks.gguf", "llama", {K.LLM.BLOCK_COUNT: 100000})
    with pytest.raises(ModelFileError, match=r"block_count' at offset \d+ is 100000"):
        read_model_facts(path)


def test_a_per_layer_array_of_the_wrong_length(tmp_path: Path) -> None:
    path = write_header(tmp_path / "heads.gguf", "llama", {K.Attention.HEAD_COUNT_KV: [2, 2]})
    with pytest.raises(ModelFileError, match=r"head_count_kv' at offset \d+ has 2 items, "
                                             r"expected one per layer \(8\)"):
        read_model_facts(path)
