"""Fixture and bundle specs: the shipped ones load, bad ones fail with a usable message.

A bad spec's message names the file, the JSON path of each problem and what is allowed
there (resources/schemas/fixture-spec.schema.json, resources/schemas/bundle-spec.schema.json
and the checks in code), so a spec is fixed from the message alone.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest

from harness.errors import FixtureError, UnknownFixtureError
from harness.facts.catalog import RuntimeClass
from harness.facts.gpu import STOCK_CACHE_TYPES
from harness.modelgen import BUNDLE_NAMES, FIXTURE_NAMES, fixture_spec_dir
from harness.modelgen.bundle_layout import manifest_bytes
from harness.modelgen.bundle_specs import SCHEMA as BUNDLE_SCHEMA
from harness.modelgen.bundle_specs import BundleSpec, SpecType, load_bundle_specs
from harness.modelgen.fixture_data import load_all, specs_digest
from harness.modelgen.hashes import read_hashes
from harness.modelgen.specs import SCHEMA as SPEC_SCHEMA
from harness.modelgen.specs import (
    Architecture,
    ModelShape,
    VocabKind,
    WeightType,
    load_fixture_spec,
    load_fixture_specs,
)
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
        "bench-q4_0",
        "bench-q4_1",
        "bench-q8_0",
        "dense",
        "dense-q4_0",
        "dense-q4_1",
        "dense-q8_0",
        "drafter",
        "drafter-corrupt",
        "drafter-foreign",
        "moe",
        "moe-q4_0",
        "moe-q4_1",
        "moe-q8_0",
        "mtp",
        "ple",
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


def _line(message: str, path: Path, where: str) -> str:
    """The line of ``message`` about ``where`` in ``path``: every problem has its own."""
    line = next((ln for ln in message.splitlines() if ln.startswith(f"{path}: {where}: ")),
                None)
    assert line is not None, message
    return line


def test_unknown_key_names_file_key_and_allowed_set(tmp_path: Path) -> None:
    path = _write(tmp_path, "typo", {**DENSE, "head_cuont": 4})
    with pytest.raises(FixtureError) as err:
        load_fixture_spec(path)
    line = _line(str(err.value), path, "$.head_cuont")
    assert "unknown key (value 4) is not allowed; allowed keys:" in line
    for key in ("head_count", "head_count_kv", "sliding_window", "aligned_token"):
        assert key in line
    assert str(err.value).endswith("fixtures/models/README.md (Spec fields) describes every key")


def test_missing_required_key_is_named(tmp_path: Path) -> None:
    path = _write(tmp_path, "noseed", {k: v for k, v in DENSE.items() if k != "seed"})
    with pytest.raises(FixtureError) as err:
        load_fixture_spec(path)
    assert "missing required key; allowed: type integer, >= 0" in _line(str(err.value), path,
                                                                         "$.seed")


@pytest.mark.parametrize(
    ("change", "where", "value", "allowed"),
    [
        ({"head_count": 3}, "$.head_count", "3 is not allowed: not a multiple of head_count_kv",
         "a multiple of 2"),
        ({"embedding_length": 66}, "$.embedding_length", "not a multiple of head_count 4",
         "a multiple of 4 (or set head_dim)"),
        ({"rope_dimension_count": 32}, "$.rope_dimension_count", "exceeds the head width 16",
         "<= 16"),
        ({"block_count": 0}, "$.block_count", "0 is not allowed", "type integer, >= 1"),
        ({"block_count": True}, "$.block_count", "true is not allowed", "type integer"),
        ({"block_count": 2.5}, "$.block_count", "2.5 is not allowed", "type integer"),
        ({"architecture": "gpt9"}, "$.architecture", '"gpt9" is not allowed',
         'one of "llama", "gemma2", "glm4moe"'),
        ({"vocab": "bpe"}, "$.vocab", '"bpe" is not allowed', 'one of "spm-bytes", "spm-foreign"'),
        ({"expert_count": 4}, "$.expert_used_count", "both be 0 or both be > 0", "1 to 4"),
        ({"expert_count": 2, "expert_used_count": 3}, "$.expert_used_count",
         "exceeds expert_count 2", "1 to 2"),
        ({"sliding_window": 32}, "$.sliding_window", "32 is not allowed",
         "no 'sliding_window' key (sliding_window is only written for gemma2"),
        ({"nextn_predict_layers": 1}, "$.nextn_predict_layers", "1 is not allowed",
         "exactly 0 (nextn_predict_layers and leading_dense_block_count are glm4moe-only"),
        ({"head_dim": None}, "$.head_dim", "null is not allowed", "type integer, >= 1"),
    ],
)
def test_invalid_values_are_rejected(tmp_path: Path, change: dict[str, Any], where: str,
                                     value: str, allowed: str) -> None:
    path = _write(tmp_path, "bad", {**DENSE, **change})
    with pytest.raises(FixtureError) as err:
        load_fixture_spec(path)
    line = _line(str(err.value), path, where)
    assert value in line
    assert f"allowed: {allowed}" in line


def test_gemma2_needs_a_window_and_no_aligned_token(tmp_path: Path) -> None:
    swa = json.loads((SPECS / "swa.json").read_text(encoding="utf-8"))
    path = _write(tmp_path, "a", {k: v for k, v in swa.items() if k != "sliding_window"})
    with pytest.raises(FixtureError) as err:
        load_fixture_spec(path)
    assert ("missing required key; allowed: type integer, >= 1 (gemma2 and gemma4 are the "
            "writer's sliding-window architectures: they need sliding_window") in _line(
                str(err.value), path, "$.sliding_window")
    path = _write(tmp_path, "b", {**swa, "aligned_token": "o"})
    with pytest.raises(FixtureError) as err:
        load_fixture_spec(path)
    line = _line(str(err.value), path, "$.aligned_token")
    assert "\"o\" is not allowed; allowed: no 'aligned_token' key (" in line
    assert "tie their output to token_embd" in line


def test_gemma4_needs_its_per_layer_width_and_no_other_architecture_takes_one(
        tmp_path: Path) -> None:
    ple = json.loads((SPECS / "ple.json").read_text(encoding="utf-8"))
    path = _write(tmp_path, "a", {k: v for k, v in ple.items()
                                  if k != "embedding_length_per_layer"})
    with pytest.raises(FixtureError) as err:
        load_fixture_spec(path)
    assert "it needs embedding_length_per_layer" in _line(str(err.value), path,
                                                         "$.embedding_length_per_layer")
    path = _write(tmp_path, "b", {**DENSE, "embedding_length_per_layer": 8})
    with pytest.raises(FixtureError) as err:
        load_fixture_spec(path)
    assert "only written for gemma4" in _line(str(err.value), path,
                                             "$.embedding_length_per_layer")


def test_glm4moe_mtp_rules(tmp_path: Path) -> None:
    mtp = json.loads((SPECS / "mtp.json").read_text(encoding="utf-8"))
    cases = [
        ({**mtp, "nextn_predict_layers": 2}, "$.nextn_predict_layers", "2 is not allowed",
         "allowed: <= 1 (", "one MTP block only"),
        ({**mtp, "leading_dense_block_count": 3}, "$.leading_dense_block_count",
         "3 is not allowed: exceeds the 2 trunk blocks", "allowed: <= 2", ""),
        ({**mtp, "block_count": 1}, "$.block_count",
         "1 is not allowed: not more than nextn_predict_layers 1", "allowed: > 1", ""),
        ({k: v for k, v in mtp.items() if k != "expert_shared_count"}, "$.expert_shared_count",
         "missing required key", "allowed: type integer, >= 0 (glm4moe needs", ""),
        ({**mtp, "expert_count": 0, "expert_used_count": 0}, "$.expert_count",
         "0 is not allowed", "allowed: >= 1 (glm4moe needs experts", ""),
    ]
    for number, (spec, where, value, allowed, rule) in enumerate(cases):
        path = _write(tmp_path, f"mtp{number}", spec)
        with pytest.raises(FixtureError) as err:
            load_fixture_spec(path)
        line = _line(str(err.value), path, where)
        assert value in line
        assert allowed in line
        assert rule in line


def test_truncated_copy_rules(tmp_path: Path) -> None:
    _write(tmp_path, "dense", DENSE)
    cut = _write(
        tmp_path,
        "cut",
        {"description": "x", "truncated_copy_of": "nope", "truncate_to_fraction": 0.5},
    )
    with pytest.raises(UnknownFixtureError) as unknown:
        load_fixture_specs(tmp_path)
    line = _line(str(unknown.value), cut, "$.truncated_copy_of")
    assert '"nope" is not allowed: not a fixture' in line
    assert 'allowed: one of "dense" (the model fixtures)' in line
    extra = {
        "description": "x",
        "truncated_copy_of": "dense",
        "truncate_to_fraction": 0.5,
        "seed": 1,
    }
    path = _write(tmp_path, "cut2", extra)
    with pytest.raises(FixtureError) as err:
        load_fixture_spec(path)
    assert ("unknown key (value 1) is not allowed; allowed keys: description, "
            "truncate_to_fraction, truncated_copy_of") in _line(str(err.value), path, "$.seed")
    over = {"description": "x", "truncated_copy_of": "dense", "truncate_to_fraction": 1.5}
    path = _write(tmp_path, "cut3", over)
    with pytest.raises(FixtureError) as err:
        load_fixture_spec(path)
    # Said once, though the key is checked at the top and in the truncated-copy branch.
    assert str(err.value).count("$.truncate_to_fraction") == 1
    assert "1.5 is not allowed" in _line(str(err.value), path, "$.truncate_to_fraction")
    assert "allowed: type number, > 0, < 1" in str(err.value)


def test_a_fraction_needs_a_source_and_a_source_must_be_a_model(tmp_path: Path) -> None:
    path = _write(tmp_path, "half", {**DENSE, "truncate_to_fraction": 0.5})
    with pytest.raises(FixtureError) as err:
        load_fixture_spec(path)
    assert "missing required key: 'truncate_to_fraction' needs it; allowed: type string" in \
        _line(str(err.value), path, "$.truncated_copy_of")
    specs = tmp_path / "specs"
    specs.mkdir()
    _write(specs, "dense", DENSE)
    _write(specs, "cut", {"description": "x", "truncated_copy_of": "dense",
                          "truncate_to_fraction": 0.5})
    twice = _write(specs, "cut-cut", {"description": "x", "truncated_copy_of": "cut",
                                      "truncate_to_fraction": 0.5})
    with pytest.raises(FixtureError) as err:
        load_fixture_specs(specs)
    assert not isinstance(err.value, UnknownFixtureError)
    line = _line(str(err.value), twice, "$.truncated_copy_of")
    assert '"cut" is not allowed: a truncated copy itself' in line
    assert 'allowed: one of "dense"' in line


def test_quantized_copy_rules(tmp_path: Path) -> None:
    _write(tmp_path, "dense", DENSE)
    _write(tmp_path, "dense-q8", {"description": "x", "quantized_copy_of": "dense",
                                  "weight_type": "q8_0"})
    copy = load_fixture_specs(tmp_path)["dense-q8"]
    assert copy.shape == load_fixture_specs(tmp_path)["dense"].shape
    assert (copy.weight_type, copy.quantized_from) == (WeightType.Q8_0, "dense")
    twice = _write(tmp_path, "dense-q8-q4", {"description": "x", "quantized_copy_of":
                                             "dense-q8", "weight_type": "q4_0"})
    with pytest.raises(FixtureError) as err:
        load_fixture_specs(tmp_path)
    assert "a copy itself" in _line(str(err.value), twice, "$.quantized_copy_of")
    twice.unlink()
    narrow = _write(tmp_path, "narrow", {**DENSE, "embedding_length": 48,
                                         "feed_forward_length": 96})
    odd = _write(tmp_path, "narrow-q4", {"description": "x", "quantized_copy_of": "narrow",
                                         "weight_type": "q4_0"})
    with pytest.raises(FixtureError) as err:
        load_fixture_specs(tmp_path)
    assert "rows of 48 values in 'narrow' are not whole 32-value blocks" in \
        _line(str(err.value), odd, "$.weight_type")
    narrow.unlink()
    odd.unlink()
    bad = _write(tmp_path, "k", {"description": "x", "quantized_copy_of": "dense",
                                 "weight_type": "q4_k"})
    with pytest.raises(FixtureError) as err:
        load_fixture_spec(bad)
    assert '"q4_k" is not allowed' in _line(str(err.value), bad, "$.weight_type")


def test_an_aligned_model_keeps_flat_weights(tmp_path: Path) -> None:
    path = _write(tmp_path, "aligned", {**DENSE, "weights": "peaked"})
    with pytest.raises(FixtureError) as err:
        load_fixture_spec(path)
    assert "an aligned token needs the flat profile" in _line(str(err.value), path,
                                                             "$.weights")


def test_non_object_spec_is_rejected(tmp_path: Path) -> None:
    path = tmp_path / "list.json"
    path.write_text("[1, 2]", encoding="utf-8")
    with pytest.raises(FixtureError) as err:
        load_fixture_spec(path)
    assert "allowed: type object" in _line(str(err.value), path, "$")


def test_nan_is_not_a_number(tmp_path: Path) -> None:
    path = tmp_path / "nan.json"
    path.write_text('{"description": "x", "truncated_copy_of": "dense", '
                    '"truncate_to_fraction": NaN}', encoding="utf-8")
    with pytest.raises(FixtureError, match=r"nan\.json: not valid JSON: NaN is not a JSON number"):
        load_fixture_spec(path)


def test_the_schemas_name_what_the_code_knows() -> None:
    spec_schema = json.loads(SPEC_SCHEMA.read_text(encoding="utf-8"))
    model = spec_schema["$defs"]["model"]["properties"]
    assert model["architecture"]["enum"] == [a.value for a in Architecture]
    assert model["vocab"]["enum"] == [v.value for v in VocabKind]
    assert set(model) == {"description"} | {f.name for f in fields(ModelShape)}
    bundle_schema = json.loads(BUNDLE_SCHEMA.read_text(encoding="utf-8"))
    assert bundle_schema["$defs"]["cache_type"]["enum"] == list(STOCK_CACHE_TYPES)
    assert bundle_schema["properties"]["spec_type"]["enum"] == [t.value for t in SpecType]
    assert bundle_schema["properties"]["runtime_class"]["enum"] == [
        r.value for r in RuntimeClass]
    assert set(bundle_schema["properties"]) == {f.name for f in fields(BundleSpec)} - {
        "name", "path"}


def _bundle_dir(tmp_path: Path, **change: Any) -> Path:
    bundle = json.loads((BUNDLES / "fused-dense.json").read_text(encoding="utf-8"))
    out = tmp_path / "bundles"
    out.mkdir()
    _write(out, "b", {**bundle, **change})
    return out


@pytest.mark.parametrize(
    ("change", "error", "where", "value", "allowed"),
    [
        ({"catalog": 1}, FixtureError, "$.catalog", "unknown key (value 1) is not allowed",
         "allowed keys: cache_type_k, cache_type_v, context_length"),
        ({"drafter": "ghost"}, UnknownFixtureError, "$.drafter",
         '"ghost" is not allowed: not a fixture', 'allowed: one of "bench", "bench-q4_0"'),
        ({"model": "ghost"}, UnknownFixtureError, "$.model",
         '"ghost" is not allowed: not a fixture', 'allowed: one of "bench", "bench-q4_0"'),
        ({"drafter": None}, FixtureError, "$.drafter", "null is not allowed",
         "allowed: type string (spec_type draft-simple needs a drafter"),
        ({"spec_type": "draft-mtp"}, FixtureError, "$.drafter", '"drafter" is not allowed',
         "allowed: type null (spec_type draft-mtp drafts from the model itself: drafter must "
         "be null)"),
        ({"spec_type": "draft-mtp", "drafter": None}, FixtureError, "$.model",
         '"dense" is not allowed: spec_type draft-mtp needs a model with an MTP',
         "allowed: a model fixture with nextn_predict_layers 1"),
        ({"cache_type_k": "q3_k"}, FixtureError, "$.cache_type_k", '"q3_k" is not allowed',
         'allowed: one of "f32", "f16", "bf16"'),
        ({"model": "drafter-corrupt"}, FixtureError, "$.model",
         '"drafter-corrupt" is not allowed: a truncated copy, not a generated model',
         'allowed: one of "bench", "bench-q4_0"'),
        ({"id": "a/b"}, FixtureError, "$.id", '"a/b" is not allowed',
         "a plain file-name stem: no '/', not starting with '.'"),
        ({"id": ".hidden"}, FixtureError, "$.id", '".hidden" is not allowed',
         "a plain file-name stem"),
        ({"tags": ["tiny", ""]}, FixtureError, "$.tags[1]", '"" is not allowed',
         "allowed: type string, length >= 1"),
        ({"runtime_class": "python"}, FixtureError, "$.runtime_class",
         '"python" is not allowed', 'allowed: one of "fused"'),
    ],
)
def test_bad_bundle_specs(
    tmp_path: Path, change: dict[str, Any], error: type[Exception], where: str, value: str,
    allowed: str,
) -> None:
    fixtures = load_fixture_specs(SPECS)
    bundles = _bundle_dir(tmp_path, **change)
    with pytest.raises(error) as err:
        load_bundle_specs(bundles, fixtures)
    line = _line(str(err.value), bundles / "b.json", where)
    assert value in line
    assert allowed in line


def test_the_recorded_hashes_are_checked(tmp_path: Path) -> None:
    assert read_hashes(fixture_spec_dir() / "sha256.json")
    path = _write(tmp_path, "sha256", {"models/dense.gguf": "ABC"})
    with pytest.raises(FixtureError) as err:
        read_hashes(path)
    line = _line(str(err.value), path, "$['models/dense.gguf']")
    assert '"ABC" is not allowed' in line
    assert "allowed: type string, matching /^[0-9a-f]{64}$/ (a sha256: 64 lowercase hex" in line
    assert str(err.value).endswith("regenerate the record with `harness fixtures --record`")


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
