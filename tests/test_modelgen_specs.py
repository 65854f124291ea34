"""Fixture and bundle specs: the shipped ones load, bad ones fail with a usable message."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from harness.errors import FixtureError, UnknownFixtureError
from harness.modelgen import BUNDLE_NAMES, FIXTURE_NAMES, fixture_spec_dir
from harness.modelgen.bundle_specs import SpecType, load_bundle_specs
from harness.modelgen.bundles import manifest_bytes
from harness.modelgen.catalog import load_all, specs_digest
from harness.modelgen.specs import Architecture, VocabKind, load_fixture_spec, load_fixture_specs
from harness.modelgen.vocab import build_vocab

SPECS = fixture_spec_dir() / "specs"
BUNDLES = fixture_spec_dir() / "bundles"

DENSE: dict[str, Any] = json.loads((SPECS / "dense.json").read_text(encoding="utf-8"))


def _write(tmp_path: Path, name: str, obj: dict[str, Any]) -> Path:
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(obj), encoding="utf-8")
    return path


def test_names_are_the_spec_files_in_name_order() -> None:
    assert FIXTURE_NAMES == (
        "bench",
        "dense",
        "drafter",
        "drafter-corrupt",
        "drafter-foreign",
        "moe",
        "mtp",
        "swa",
    )
    assert BUNDLE_NAMES == ("fused-dense", "fused-mtp")


def test_every_shipped_spec_loads() -> None:
    fixtures, bundles = load_all()
    assert tuple(fixtures) == FIXTURE_NAMES
    assert tuple(bundles) == BUNDLE_NAMES


def test_shipped_shapes_match_their_purpose() -> None:
    fixtures, _ = load_all()
    dense, moe, swa, mtp = (fixtures[n].shape for n in ("dense", "moe", "swa", "mtp"))
    assert dense is not None
    assert moe is not None
    assert swa is not None
    assert mtp is not None
    assert (dense.block_count, dense.head_count, dense.head_count_kv) == (2, 4, 2)
    assert dense.embedding_length == 64
    assert len(build_vocab(dense.vocab).tokens) == 269
    assert (moe.expert_count, moe.expert_used_count) == (4, 2)
    assert swa.architecture is Architecture.GEMMA2
    assert swa.sliding_window == 32
    assert mtp.architecture is Architecture.GLM4_MOE
    assert (mtp.block_count, mtp.nextn_predict_layers, mtp.trunk_block_count) == (3, 1, 2)
    corrupt = fixtures["drafter-corrupt"].truncation
    assert corrupt is not None
    assert corrupt.source == "drafter"


def test_dense_and_drafter_agree_and_foreign_does_not() -> None:
    fixtures, _ = load_all()
    dense, drafter, foreign = (fixtures[n].shape for n in ("dense", "drafter", "drafter-foreign"))
    assert dense is not None
    assert drafter is not None
    assert foreign is not None
    # Same vocab and the same aligned token: the drafter's guesses are the target's.
    assert dense.vocab == drafter.vocab == VocabKind.SPM_BYTES
    assert dense.aligned_token is not None
    assert dense.aligned_token == drafter.aligned_token
    ours, theirs = build_vocab(dense.vocab), build_vocab(foreign.vocab)
    assert len(ours.tokens) != len(theirs.tokens)
    # llama.cpp compares token texts from id 5 on; the foreign vocab differs there.
    assert ours.tokens[5] != theirs.tokens[5]


def test_unknown_key_names_file_key_and_allowed_set(tmp_path: Path) -> None:
    path = _write(tmp_path, "typo", {**DENSE, "head_cuont": 4})
    with pytest.raises(FixtureError) as err:
        load_fixture_spec(path)
    message = str(err.value)
    assert str(path) in message
    assert "'head_cuont'" in message
    assert "allowed keys:" in message
    for key in ("head_count", "head_count_kv", "sliding_window", "aligned_token"):
        assert key in message


def test_missing_required_key_is_named(tmp_path: Path) -> None:
    obj = {k: v for k, v in DENSE.items() if k != "seed"}
    with pytest.raises(FixtureError, match="missing required key 'seed'"):
        load_fixture_spec(_write(tmp_path, "noseed", obj))


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"head_count": 3}, "not a multiple of head_count_kv"),
        ({"block_count": 0}, "'block_count' must be an integer >= 1"),
        ({"block_count": True}, "'block_count' must be an integer"),
        ({"architecture": "gpt9"}, "allowed values: gemma2, glm4moe, llama"),
        ({"vocab": "bpe"}, "allowed values: spm-bytes, spm-foreign"),
        ({"expert_count": 4}, "both be 0 or both be > 0"),
        ({"sliding_window": 32}, "only written for gemma2"),
        ({"nextn_predict_layers": 1}, "glm4moe-only"),
    ],
)
def test_invalid_values_are_rejected(tmp_path: Path, change: dict[str, Any], match: str) -> None:
    with pytest.raises(FixtureError, match=match):
        load_fixture_spec(_write(tmp_path, "bad", {**DENSE, **change}))


def test_gemma2_needs_a_window_and_no_aligned_token(tmp_path: Path) -> None:
    swa = json.loads((SPECS / "swa.json").read_text(encoding="utf-8"))
    no_window = {k: v for k, v in swa.items() if k != "sliding_window"}
    with pytest.raises(FixtureError, match="gemma2 needs 'sliding_window'"):
        load_fixture_spec(_write(tmp_path, "a", no_window))
    with pytest.raises(FixtureError, match="tied output"):
        load_fixture_spec(_write(tmp_path, "b", {**swa, "aligned_token": "o"}))


def test_glm4moe_mtp_rules(tmp_path: Path) -> None:
    mtp = json.loads((SPECS / "mtp.json").read_text(encoding="utf-8"))
    with pytest.raises(FixtureError, match="one MTP block only"):
        load_fixture_spec(_write(tmp_path, "a", {**mtp, "nextn_predict_layers": 2}))
    with pytest.raises(FixtureError, match="leading_dense_block_count exceeds"):
        load_fixture_spec(_write(tmp_path, "b", {**mtp, "leading_dense_block_count": 3}))
    no_shared = {k: v for k, v in mtp.items() if k != "expert_shared_count"}
    with pytest.raises(FixtureError, match="glm4moe needs expert_shared_count"):
        load_fixture_spec(_write(tmp_path, "c", no_shared))


def test_truncated_copy_rules(tmp_path: Path) -> None:
    _write(tmp_path, "dense", DENSE)
    _write(
        tmp_path,
        "cut",
        {"description": "x", "truncated_copy_of": "nope", "truncate_to_fraction": 0.5},
    )
    with pytest.raises(UnknownFixtureError, match="known fixtures: cut, dense"):
        load_fixture_specs(tmp_path)
    extra = {
        "description": "x",
        "truncated_copy_of": "dense",
        "truncate_to_fraction": 0.5,
        "seed": 1,
    }
    with pytest.raises(FixtureError, match="unknown key 'seed'"):
        load_fixture_spec(_write(tmp_path, "cut2", extra))
    over = {"description": "x", "truncated_copy_of": "dense", "truncate_to_fraction": 1.5}
    with pytest.raises(FixtureError, match="strictly between 0 and 1"):
        load_fixture_spec(_write(tmp_path, "cut3", over))


def test_non_object_spec_is_rejected(tmp_path: Path) -> None:
    path = tmp_path / "list.json"
    path.write_text("[1, 2]", encoding="utf-8")
    with pytest.raises(FixtureError, match="expected a JSON object"):
        load_fixture_spec(path)


def _bundle_dir(tmp_path: Path, **change: Any) -> Path:
    bundle = json.loads((BUNDLES / "fused-dense.json").read_text(encoding="utf-8"))
    out = tmp_path / "bundles"
    out.mkdir()
    _write(out, "b", {**bundle, **change})
    return out


@pytest.mark.parametrize(
    ("change", "error", "match"),
    [
        ({"catalog": 1}, FixtureError, "unknown key 'catalog'; allowed keys: cache_type_k"),
        ({"drafter": "ghost"}, UnknownFixtureError, "drafter 'ghost' is not a fixture"),
        ({"drafter": None}, FixtureError, "draft-simple needs a drafter"),
        ({"spec_type": "draft-mtp"}, FixtureError, "drafter must be null"),
        ({"spec_type": "draft-mtp", "drafter": None}, FixtureError, "needs a model with an MTP"),
        ({"cache_type_k": "q3_k"}, FixtureError, "allowed values: bf16, f16, f32"),
        ({"model": "drafter-corrupt"}, FixtureError, "is not a generated model"),
        ({"id": "a/b"}, FixtureError, "plain file-name stem"),
    ],
)
def test_bad_bundle_specs(
    tmp_path: Path, change: dict[str, Any], error: type[Exception], match: str
) -> None:
    fixtures = load_fixture_specs(SPECS)
    with pytest.raises(error, match=match):
        load_bundle_specs(_bundle_dir(tmp_path, **change), fixtures)


def test_manifest_holds_exactly_the_catalog_fields() -> None:
    _, bundles = load_all()
    dense = json.loads(manifest_bytes(bundles["fused-dense"]))
    assert list(dense) == [
        "id",
        "runtime_class",
        "context_length",
        "cache_type_k",
        "cache_type_v",
        "drafter",
        "spec_type",
        "tags",
    ]
    assert dense["runtime_class"] == "fused"
    assert dense["drafter"] == f"text/{dense['id']}-drafter.gguf"
    assert dense["spec_type"] == SpecType.DRAFT_SIMPLE.value
    mtp = json.loads(manifest_bytes(bundles["fused-mtp"]))
    assert mtp["drafter"] is None
    assert mtp["spec_type"] == "draft-mtp"


def test_digest_changes_with_any_spec_byte(tmp_path: Path) -> None:
    copy = tmp_path / "models"
    shutil.copytree(fixture_spec_dir(), copy)
    before = specs_digest(copy)
    assert before == specs_digest(fixture_spec_dir())
    spec = copy / "specs" / "dense.json"
    spec.write_text(spec.read_text(encoding="utf-8") + " ", encoding="utf-8")
    assert specs_digest(copy) != before
