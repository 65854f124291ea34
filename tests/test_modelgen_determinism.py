"""The GGUF writer is deterministic, matches the committed record, and the cache heals."""

from __future__ import annotations

import json
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest

from harness.errors import FixtureError, UnknownFixtureError
from harness.files import sha256_file
from harness.modelgen import (
    BUNDLE_NAMES,
    FIXTURE_NAMES,
    FixtureSet,
    ensure_fixtures,
    read_recorded_hashes,
    write_all,
)
from harness.modelgen.fixture_data import load_all, specs_digest
from harness.modelgen.specs import Architecture, ModelShape, WeightType
from harness.modelgen.vocab import build_vocab


@pytest.fixture(scope="module")
def fixture_set(tmp_path_factory: pytest.TempPathFactory) -> FixtureSet:
    return ensure_fixtures(tmp_path_factory.mktemp("fixtures"))


def test_write_all_is_byte_stable_and_matches_the_record(tmp_path: Path) -> None:
    first = write_all(tmp_path / "a")
    second = write_all(tmp_path / "b")
    assert first == second
    assert first == read_recorded_hashes()


def test_every_fixture_and_bundle_is_recorded() -> None:
    recorded = read_recorded_hashes()
    for name in FIXTURE_NAMES:
        assert f"models/{name}.gguf" in recorded
    for name in BUNDLE_NAMES:
        assert f"bundles/{name}/manifest.json" in recorded


def test_ensure_fixtures_gives_verified_paths(fixture_set: FixtureSet) -> None:
    recorded = read_recorded_hashes()
    assert tuple(fixture_set.models) == FIXTURE_NAMES
    assert tuple(fixture_set.bundles) == BUNDLE_NAMES
    for rel, digest in recorded.items():
        assert sha256_file(fixture_set.root / rel) == digest
    assert fixture_set.model("dense") == fixture_set.root / "models" / "dense.gguf"
    assert (fixture_set.bundle("fused-mtp") / "manifest.json").is_file()


def test_default_root_is_content_addressed_under_the_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HARNESS_CACHE", str(tmp_path))
    fixtures = ensure_fixtures()
    assert fixtures.root == tmp_path / "fixtures" / specs_digest()


def test_tampered_and_missing_files_are_rewritten(tmp_path: Path) -> None:
    root = ensure_fixtures(tmp_path).root
    recorded = read_recorded_hashes()
    tampered = root / "models" / "dense.gguf"
    data = bytearray(tampered.read_bytes())
    data[-1] ^= 0xFF
    tampered.write_bytes(bytes(data))
    manifest = root / "bundles" / "fused-dense" / "manifest.json"
    manifest.unlink()
    assert sha256_file(tampered) != recorded["models/dense.gguf"]

    ensure_fixtures(tmp_path)

    assert sha256_file(tampered) == recorded["models/dense.gguf"]
    assert sha256_file(manifest) == recorded["bundles/fused-dense/manifest.json"]


def _ensure_root(root: str) -> str:
    return str(ensure_fixtures(Path(root)).root)


def test_concurrent_processes_share_one_root(tmp_path: Path) -> None:
    with ProcessPoolExecutor(max_workers=2) as pool:
        roots = list(pool.map(_ensure_root, [str(tmp_path)] * 2))
    assert roots == [str(tmp_path)] * 2
    assert not list(tmp_path.rglob("*.tmp")), "temp files were left behind"


def test_a_stale_record_is_reported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    stale = {**read_recorded_hashes(), "models/gone.gguf": "0" * 64}
    monkeypatch.setattr("harness.modelgen.read_recorded_hashes", lambda: stale)
    with pytest.raises(FixtureError, match=r"recorded but no longer written: models/gone\.gguf"):
        ensure_fixtures(tmp_path)


def test_writer_output_differing_from_record_is_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    wrong = {**read_recorded_hashes(), "models/dense.gguf": "0" * 64}
    monkeypatch.setattr("harness.modelgen.read_recorded_hashes", lambda: wrong)
    with pytest.raises(FixtureError, match=r"sha256\.json records 0000"):
        ensure_fixtures(tmp_path)


def test_unknown_names_list_the_known_ones(fixture_set: FixtureSet) -> None:
    with pytest.raises(UnknownFixtureError) as err:
        fixture_set.model("dnese")
    assert "'dnese'" in str(err.value)
    for name in FIXTURE_NAMES:
        assert name in str(err.value)
    with pytest.raises(UnknownFixtureError, match="known bundles: fused-dense, fused-mtp"):
        fixture_set.bundle("fused-nothing")


def test_bundles_are_byte_identical_copies(fixture_set: FixtureSet) -> None:
    dense = fixture_set.bundle("fused-dense")
    manifest: dict[str, Any] = json.loads((dense / "manifest.json").read_text("utf-8"))
    model = dense / "text" / f"{manifest['id']}.gguf"
    assert model.read_bytes() == fixture_set.model("dense").read_bytes()
    drafter = dense / manifest["drafter"]
    assert drafter.read_bytes() == fixture_set.model("drafter").read_bytes()
    mtp = fixture_set.bundle("fused-mtp")
    mtp_manifest = json.loads((mtp / "manifest.json").read_text("utf-8"))
    assert mtp_manifest["drafter"] is None
    assert sorted(p.name for p in (mtp / "text").iterdir()) == [f"{mtp_manifest['id']}.gguf"]


def _field(reader: gguf.GGUFReader, key: str) -> Any:
    field = reader.get_field(key)
    assert field is not None, f"missing key {key}"
    return field.contents()


def _model_shapes() -> list[tuple[str, ModelShape, WeightType]]:
    fixtures, _ = load_all()
    return [(n, s.shape, s.weight_type) for n, s in fixtures.items() if s.shape is not None]


@pytest.mark.parametrize(("name", "shape", "weight_type"), _model_shapes(),
                         ids=lambda v: str(v)[:20])
def test_reader_reads_back_what_the_spec_declares(
    fixture_set: FixtureSet, name: str, shape: ModelShape, weight_type: WeightType
) -> None:
    reader = gguf.GGUFReader(fixture_set.model(name))
    arch = shape.architecture.value
    k, llm, attn = gguf.Keys, gguf.Keys.LLM, gguf.Keys.Attention
    assert _field(reader, k.General.ARCHITECTURE) == arch
    assert _field(reader, llm.BLOCK_COUNT.format(arch=arch)) == shape.block_count
    assert _field(reader, llm.EMBEDDING_LENGTH.format(arch=arch)) == shape.embedding_length
    assert _field(reader, attn.HEAD_COUNT.format(arch=arch)) == shape.head_count
    assert _field(reader, attn.HEAD_COUNT_KV.format(arch=arch)) == shape.head_count_kv
    assert len(_field(reader, k.Tokenizer.LIST)) == len(build_vocab(shape.vocab).tokens)
    assert _field(reader, k.General.FILE_TYPE) == weight_type.file_type
    optional = {
        llm.EXPERT_COUNT: shape.expert_count or None,
        llm.EXPERT_USED_COUNT: shape.expert_used_count or None,
        llm.NEXTN_PREDICT_LAYERS: shape.nextn_predict_layers or None,
        llm.LEADING_DENSE_BLOCK_COUNT: shape.leading_dense_block_count,
        attn.SLIDING_WINDOW: shape.sliding_window,
        attn.KEY_LENGTH: shape.head_dim,
    }
    for key, want in optional.items():
        field = reader.get_field(key.format(arch=arch))
        assert (field.contents() if field is not None else None) == want, key
    matrices = {t.tensor_type for t in reader.tensors if len(t.shape) > 1
                and not t.name.endswith("ffn_gate_inp.weight")}
    assert matrices == {weight_type.ggml_type}
    # Norms and biases stay F32 in every copy, as llama-quantize leaves them.
    assert {t.tensor_type for t in reader.tensors if len(t.shape) == 1} == {
        gguf.GGMLQuantizationType.F32}


def test_a_quantized_copy_holds_its_sources_weights(fixture_set: FixtureSet) -> None:
    """Quantizing is the only difference: dequantized, the copy is the source within a
    q8_0 step (a block's largest value over 127, its scale rounded to f16)."""
    source = {t.name: t for t in gguf.GGUFReader(fixture_set.model("bench")).tensors}
    copy = gguf.GGUFReader(fixture_set.model("bench-q8_0"))
    for tensor in copy.tensors:
        want = np.asarray(source[tensor.name].data, dtype=np.float32)
        got = gguf.quants.dequantize(tensor.data, tensor.tensor_type).reshape(want.shape)
        step = np.abs(want).max() / 127
        assert np.abs(got - want).max() <= step, tensor.name


def test_peaked_weights_are_not_flat(fixture_set: FixtureSet) -> None:
    """The peaked profile scales each matrix by its fan-in and draws the norms around 1;
    the flat profile is uniform in ±0.05 with unit norms."""
    peaked = {t.name: np.asarray(t.data) for t in gguf.GGUFReader(
        fixture_set.model("bench")).tensors}
    flat = {t.name: np.asarray(t.data) for t in gguf.GGUFReader(
        fixture_set.model("dense")).tensors}
    assert np.abs(flat["blk.0.attn_q.weight"]).max() < 0.05
    assert np.abs(peaked["blk.0.attn_q.weight"]).max() > 0.05
    assert set(np.unique(flat["blk.0.attn_norm.weight"])) == {1.0}
    norm = peaked["blk.0.attn_norm.weight"]
    assert 0.74 < norm.min() < norm.max() < 1.26
    assert len(np.unique(norm)) > 100


def test_mtp_fixture_carries_the_nextn_head(fixture_set: FixtureSet) -> None:
    reader = gguf.GGUFReader(fixture_set.model("mtp"))
    names = {t.name for t in reader.tensors}
    last = 2  # block_count 3: blocks 0-1 are the trunk, block 2 the MTP block
    for kind in ("nextn.eh_proj", "nextn.enorm", "nextn.hnorm", "exp_probs_b"):
        assert any(n.startswith(f"blk.{last}.{kind}") for n in names), kind
    assert not any(n.startswith("blk.1.nextn") for n in names)
    assert "blk.0.ffn_gate.weight" in names  # leading dense block
    assert "blk.1.ffn_gate_exps.weight" in names


def test_aligned_models_point_one_output_row_at_the_shared_axis(
    fixture_set: FixtureSet,
) -> None:
    for name in ("dense", "drafter", "mtp"):
        reader = gguf.GGUFReader(fixture_set.model(name))
        tensors = {t.name: np.asarray(t.data) for t in reader.tensors}
        shape = load_all()[0][name].shape
        assert shape is not None
        token = build_vocab(shape.vocab).token_id("\u2581hello")
        output = tensors["output.weight"]
        assert output[token, 0] == 1.0
        assert not output[token, 1:].any()
        assert (tensors["token_embd.weight"][:, 0] > 0.9).all()


def test_swa_fixture_is_gemma2(fixture_set: FixtureSet) -> None:
    reader = gguf.GGUFReader(fixture_set.model("swa"))
    assert _field(reader, gguf.Keys.General.ARCHITECTURE) == Architecture.GEMMA2.value
    assert "output.weight" not in {t.name for t in reader.tensors}  # tied embeddings


def test_corrupt_drafter_does_not_parse(fixture_set: FixtureSet) -> None:
    path = fixture_set.model("drafter-corrupt")
    whole = fixture_set.model("drafter").read_bytes()
    assert whole.startswith(path.read_bytes())
    assert path.stat().st_size == len(whole) // 2
    # GGUFReader surfaces numpy's reshape/buffer ValueError; its text is numpy's, not stable.
    with pytest.raises(ValueError):  # noqa: PT011
        gguf.GGUFReader(path)
