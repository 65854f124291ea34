"""The run.json schema and its parser: what CI runners may send, and what is refused.

Every refusal is a RunRecordError naming the JSON path of the refused value, whatever
the document does: numbers JSON cannot spell, numbers too long to convert, nesting
deep enough to exhaust a stack, bytes that are not UTF-8, wrong types, long strings.
"""

from __future__ import annotations

import json
import math
from dataclasses import fields, replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator
from results_fixtures import BUILD, CPU_BOX, GPU_BOX, at, fig, figure_key, make_run, outcome

from harness.ab.design import DESIGNS
from harness.bisect.search import Verdict
from harness.errors import HarnessError
from harness.numerics.fingerprint import NumericsVerdict
from harness.plugin.recording.outcomes import OutcomeTally
from harness.plugin.recording.run_file import build_ref, run_record
from harness.results.json_hazards import unrepresentable
from harness.results.rules import AbVerdict
from harness.results.run_record import (
    METRICS,
    BuildRef,
    Figure,
    FigureKey,
    Hardware,
    Outcome,
    RunRecord,
)
from harness.results.run_record import (
    TestOutcome as RunOutcome,
)
from harness.results.run_schema import (
    AB_DESIGNS,
    AB_VERDICTS,
    BISECT_VERDICTS,
    MAX_DEPTH,
    MAX_DOCUMENT_BYTES,
    NUMERICS_VERDICTS,
    RUN_SCHEMA,
)
from harness.results.run_validation import (
    RUN_VALIDATOR,
    RunRecordError,
    check_run,
    parse_run_json,
    run_from_json,
)
from harness.results.schema_quick_check import passes_quick_check


def _ab_result() -> dict[str, Any]:
    """An ``ab`` object shaped as harness/ab/report.py's record_json writes it."""
    return {
        "baseline": "build cpu-0123456789ab", "candidate": "build cpu-feedbeef0000",
        "design": "interleaved", "threshold": 0.03,
        "metrics": {
            "decode_tps": {"verdict": "regressed", "pairs": 16, "ratio": 0.9012,
                           "ci_low": 0.8875, "ci_high": 0.9150},
            "ttft_ms": {"verdict": "unknown", "pairs": 2, "ratio": None, "ci_low": None,
                        "ci_high": None},
        },
        "counter_changes": [{"name": "compute_mib[CPU]", "baseline": "300.01",
                             "candidate": "412.50"}],
    }


#: A numerics fingerprint as the suite records one (Fingerprint.as_json).
NUMERICS = {"suites/test_numerics.py::test_distributions_match_the_reference[bench-f16]": {
    "tokens": [3, 7, 7], "rows": [{"3": -0.105361, "7": -2.302585}, None,
                                  {"0": -1e-06, "7": -0.0}]}}


def _full_run() -> RunRecord:
    return replace(_bare_full_run(), ab=_ab_result(), numerics=NUMERICS)


def _bare_full_run() -> RunRecord:
    return make_run(
        "run-full", branch="feature/kv-quant", started_at=at(5), hardware=GPU_BOX,
        build=BuildRef(backend="cuda", version="version: 5001 (1234abcd)",
                       source_digest="f" * 64, build_key="cuda-feedbeef",
                       image_digest="sha256:" + "a" * 64),
        outcomes=[outcome("suites/test_smoke.py::test_ready", duration_s=1.25),
                  outcome("suites/test_smoke.py::test_bad", "failed",
                          message="AssertionError: 3 != 4\nsecond line | pipe"),
                  outcome("suites/test_gpu.py::test_x[q8_0-fa]", "skipped", message=None)],
        figures=[replace(fig("decode_tps", 1234.5678), predicted=1500.0),
                 fig("ttft_ms", 12.0625,
                                                   key=figure_key(n_prompt=512)),
                 fig("kv_mib", 64.0, key=figure_key(cache_type_k="q8_0", offload="moe"))],
        labels={"ci": "nightly", "pr": "1234"})


def _body() -> dict[str, Any]:
    """The JSON form of a full run, as a CI runner's run.json holds it."""
    loaded: dict[str, Any] = json.loads(json.dumps(_full_run().to_json()))
    return loaded


def _refused(data: bytes | str) -> RunRecordError:
    with pytest.raises(RunRecordError) as caught:
        parse_run_json(data)
    return caught.value


def _with(path: str, literal: str) -> str:
    """run.json text with the value at ``path`` (dotted, [i] for items) spelled ``literal``."""
    body = _body()
    *parents, last = path.replace("[", ".").replace("]", "").split(".")
    node: Any = body
    for part in parents:
        node = node[int(part)] if part.isdigit() else node[part]
    node[int(last) if last.isdigit() else last] = "@@value@@"
    return json.dumps(body).replace('"@@value@@"', literal)


# -- the schema itself ---------------------------------------------------------------


def test_the_schema_is_a_valid_draft_2020_12_schema() -> None:
    Draft202012Validator.check_schema(RUN_SCHEMA)


@pytest.mark.parametrize(("schema", "cls"), [
    (RUN_SCHEMA, RunRecord),
    (RUN_SCHEMA["properties"]["hardware"], Hardware),
    (RUN_SCHEMA["properties"]["build"], BuildRef),
    (RUN_SCHEMA["properties"]["outcomes"]["items"], RunOutcome),
    (RUN_SCHEMA["properties"]["figures"]["items"], Figure),
    (RUN_SCHEMA["properties"]["figures"]["items"]["properties"]["key"], FigureKey),
])
def test_the_schema_names_exactly_the_fields_of_each_record(schema: dict[str, Any],
                                                            cls: type) -> None:
    # The builder passes validated objects as keywords: a field the schema lacks would
    # refuse every run, a key the class lacks would be a TypeError.
    # ``ratio`` is written beside a prediction (value / predicted), not a field of its own.
    derived = {"schema"} | ({"ratio"} if cls is Figure else set())
    assert set(schema["properties"]) - derived == {f.name for f in fields(cls)}


# -- what the harness writes is read back unchanged ------------------------------------


def _harness_written_runs() -> list[RunRecord]:
    tally = OutcomeTally()
    tally.add("suites/test_a.py::test_ok", "call", "passed", 0.25)
    tally.add("suites/test_a.py::test_skip", "setup", "skipped", 0.0, message="no GPU")
    tally.add("suites/test_a.py::test_xf", "call", "skipped", 0.1, wasxfail=True)
    tally.add("suites/test_a.py::test_xp", "call", "passed", 0.1, wasxfail=True)
    tally.add("suites/test_a.py::test_bad", "call", "failed", 1.5, message="assert 1 == 2")
    tally.add("suites/test_a.py::test_fixture", "setup", "failed", 0.0, message="boom")
    figures = [fig(metric, 1.5) for metric in sorted(METRICS)]
    return [
        make_run("bare"), make_run("gpu", hardware=GPU_BOX), _full_run(), _bare_full_run(),
        make_run("cpu-box", hardware=CPU_BOX, build=BUILD, labels={}),
        run_record(run_id="20250101T000000Z-0123abcd", started_at=at(0), hardware=GPU_BOX,
                   build=build_ref(None, "cpu-0123"), outcomes=tally.outcomes(),
                   figures=figures, labels={"ci": "nightly"}),
    ]


@pytest.mark.parametrize("run", _harness_written_runs(), ids=lambda r: r.run_id)
def test_runs_the_harness_writes_round_trip(run: RunRecord) -> None:
    text = json.dumps(run.to_json(), allow_nan=False)
    assert parse_run_json(text) == run
    assert parse_run_json(text.encode("utf-8")) == run
    assert run_from_json(json.loads(text)) == run
    check_run(run)


def test_optional_fields_may_be_left_out() -> None:
    body = _body()
    del body["schema"], body["outcomes"], body["figures"], body["labels"], body["ab"]
    body["hardware"] = {"host": "h", "cpu": "c"}
    body["build"] = {k: body["build"][k] for k in ("backend", "version", "source_digest",
                                                   "build_key")}
    run = run_from_json(body)
    assert run.hardware == Hardware(host="h", cpu="c")
    assert (run.outcomes, run.figures, run.labels, run.ab) == ((), (), {}, None)


def test_a_prediction_is_written_with_its_ratio_and_only_where_there_is_one() -> None:
    written = _bare_full_run().to_json()["figures"]
    assert (written[0]["predicted"], written[0]["ratio"]) == (1500.0, round(1234.5678 / 1500, 6))
    assert not {"predicted", "ratio"} & set(written[1])
    body = _body()
    body["figures"][0]["predicted"] = 0
    assert "$.figures[0].predicted" in str(_refused(json.dumps(body)))


def test_a_run_without_an_ab_result_writes_no_ab_key() -> None:
    # Every run.json written before the field existed stays as it was.
    assert "ab" not in _bare_full_run().to_json()
    assert _full_run().to_json()["ab"] == _ab_result()


def test_the_ab_object_record_json_writes_round_trips() -> None:
    run = parse_run_json(json.dumps(_full_run().to_json(), allow_nan=False))
    assert run.ab == _ab_result()
    assert run == _full_run()
    # Integral numbers are read as the floats record_json writes.
    body = _body()
    body["ab"]["threshold"] = 0.5
    body["ab"]["metrics"]["decode_tps"].update(ratio=1, ci_low=1, ci_high=2)
    again = run_from_json(body).ab
    assert again is not None
    decode = again["metrics"]["decode_tps"]
    assert [type(decode[k]) for k in ("ratio", "ci_low", "ci_high")] == [float] * 3


def test_every_verdict_of_harness_bisect_is_accepted() -> None:
    assert tuple(v.value for v in Verdict) == BISECT_VERDICTS


def test_every_numerics_verdict_is_accepted() -> None:
    assert tuple(v.value for v in NumericsVerdict) == NUMERICS_VERDICTS


def test_every_metric_design_and_verdict_of_harness_ab_is_accepted() -> None:
    assert set(AB_DESIGNS) == set(DESIGNS)
    assert set(AB_VERDICTS) == set(AbVerdict)
    for design in DESIGNS:
        body = _body()
        body["ab"]["design"] = design
        body["ab"]["metrics"] = {
            name: {"verdict": verdict, "pairs": 0, "ratio": 1e-9, "ci_low": 1e-9,
                   "ci_high": 1e15}
            for name, verdict in zip(sorted(METRICS), AB_VERDICTS * 2, strict=False)}
        body["ab"]["counter_changes"] = []
        assert run_from_json(body).ab == body["ab"]


def test_values_at_the_limits_are_accepted() -> None:
    body = _body()
    body["hardware"]["vram_mib"] = None
    body["figures"][0]["key"]["n_prompt"] = 2**31 - 1
    body["figures"][0]["key"]["offload"] = ""
    body["outcomes"][0]["message"] = "m" * 65536
    body["outcomes"][0]["duration_s"] = 0
    body["branch"] = "b" * 256
    body["run_id"] = "a" + "1" * 127
    run = run_from_json(body)
    assert run.figures[0].key.n_prompt == 2**31 - 1
    assert run.outcomes[0].duration_s == 0.0


# -- numbers JSON has no spelling for ---------------------------------------------------

_NUMBER_FIELDS = ["$.build.image_digest", "$.hardware.vram_mib", "$.outcomes[1].duration_s",
                  "$.figures[0].value", "$.ab.threshold", "$.ab.metrics.decode_tps.ratio",
                  "$.ab.metrics.ttft_ms.ci_high"]


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity"])
@pytest.mark.parametrize("field", _NUMBER_FIELDS)
def test_non_finite_constants_are_refused_naming_the_field(field: str, constant: str) -> None:
    error = _refused(_with(field.removeprefix("$."), constant))
    assert error.field == field
    assert f"{field}: {constant} is not allowed" in str(error)
    assert "finite number" in str(error)


@pytest.mark.parametrize("literal", ["1e999", "-1e999", "1.5e400"])
def test_a_float_overflowing_to_infinity_is_refused(literal: str) -> None:
    error = _refused(_with("figures[0].value", literal))
    assert error.field == "$.figures[0].value"
    assert "infinity" in str(error)


def test_a_5000_digit_integer_is_refused_before_it_is_converted() -> None:
    error = _refused(_with("hardware.vram_mib", "9" * 5000))
    assert error.field == "$.hardware.vram_mib"
    assert "5000 digits" in str(error)


def test_a_non_finite_float_in_a_parsed_body_is_refused() -> None:
    body = _body()
    body["outcomes"][2]["duration_s"] = math.nan
    with pytest.raises(RunRecordError) as caught:
        run_from_json(body)
    assert caught.value.field == "$.outcomes[2].duration_s"


# -- the shape of the document ----------------------------------------------------------


@pytest.mark.parametrize("depth", [MAX_DEPTH + 1, 1000, 100_000])
def test_deep_nesting_is_refused_without_recursing(depth: int) -> None:
    assert _refused("[" * depth + "]" * depth).field == "$"
    assert _refused('{"a":' * depth + "1" + "}" * depth).field == "$"
    # Inside a real record, where a value could hide it.
    assert _refused(_with("labels.ci", "[" * depth + "]" * depth)).field == "$"
    # Cut off before any bracket closes.
    assert _refused("[" * depth).field == "$"
    assert _refused('{"a": ' + "[" * depth + "{}" + "]" * (depth - 2)).field == "$"


def test_deep_nesting_built_in_code_is_refused_without_recursing() -> None:
    body = _body()
    deep: list[Any] = []
    body["labels"]["ci"] = deep
    for _ in range(100_000):
        deep.append([])
        deep = deep[0]
    with pytest.raises(RunRecordError, match="nested more than"):
        run_from_json(body)


def test_nesting_up_to_the_limit_is_parsed() -> None:
    # Parsed, then refused for what it is (an array), not for its depth.
    error = _refused("[" * MAX_DEPTH + "]" * MAX_DEPTH)
    assert "expected an object" in str(error)


@pytest.mark.parametrize(("change", "field", "words"), [
    (lambda b: b["outcomes"][1].update(test_id=["suites/x.py::t"]), "$.outcomes[1].test_id",
     "expected a string"),
    (lambda b: b["outcomes"][1].update(message={"text": "x"}), "$.outcomes[1].message",
     "expected a string or null"),
    (lambda b: b["outcomes"][1].update(outcome=None), "$.outcomes[1].outcome",
     "expected one of 'passed'"),
    (lambda b: b["outcomes"][1].update(outcome="crashed"), "$.outcomes[1].outcome",
     "'crashed' is not allowed"),
    # A known flake is recorded as xfailed: its own word is no Outcome.
    (lambda b: b["outcomes"][1].update(outcome="known-flake"), "$.outcomes[1].outcome",
     "'known-flake' is not allowed: expected one of 'passed', 'failed', 'error'"),
    (lambda b: b["figures"][2]["key"].update(n_prompt="128"), "$.figures[2].key.n_prompt",
     "expected an integer"),
    (lambda b: b["figures"][2]["key"].update(n_gen=32.0), "$.figures[2].key.n_gen",
     "expected an integer"),
    (lambda b: b["figures"][2]["key"].update(n_gen=2**31), "$.figures[2].key.n_gen",
     "an integer from 0 to 2147483647"),
    (lambda b: b["outcomes"][0].update(duration_s=True), "$.outcomes[0].duration_s",
     "true is not allowed"),
    (lambda b: b["outcomes"][0].update(duration_s=-0.5), "$.outcomes[0].duration_s",
     "a number from 0"),
    (lambda b: b["hardware"].update(vram_mib=True), "$.hardware.vram_mib",
     "expected an integer or null"),
    (lambda b: b["hardware"].update(vram_mib=-1), "$.hardware.vram_mib", "from 0"),
    (lambda b: b["figures"][0].update(value="fast"), "$.figures[0].value",
     "expected a finite number"),
    (lambda b: b["figures"][0].update(metric="bogus"), "$.figures[0].metric",
     "expected one of 'decode_tps'"),
    (lambda b: b.update(branch="main\x00evil"), "$.branch", "without NUL"),
    (lambda b: b["labels"].update(ci="a\x00b"), "$.labels.ci", "without NUL"),
    (lambda b: b["labels"].update({"bad\x00key": "v"}), "$.labels['bad\\x00key']",
     "the key 'bad\\x00key'"),
    (lambda b: b.update(branch="b" * 257), "$.branch", "257 characters are too many"),
    (lambda b: b["outcomes"][0].update(message="m" * 65537), "$.outcomes[0].message",
     "65537 characters are too many"),
    (lambda b: b["outcomes"][0].update(test_id="t" * 4097), "$.outcomes[0].test_id",
     "4097 characters"),
    (lambda b: b["labels"].update({f"k{i}": "v" for i in range(300)}), "$.labels",
     "keys are too many"),
    (lambda b: b.update(typo="x"), "$.typo", "unknown key"),
    (lambda b: b["hardware"].update(vram_gib=80), "$.hardware.vram_gib", "unknown key"),
    (lambda b: b["figures"][1]["key"].update(threads=8), "$.figures[1].key.threads",
     "unknown key"),
    (lambda b: b.pop("commit"), "$.commit", "required"),
    (lambda b: b["build"].pop("build_key"), "$.build.build_key", "required"),
    (lambda b: b.update(run_id="../../etc"), "$.run_id", "'../../etc' is not allowed"),
    (lambda b: b.update(run_id="run\n"), "$.run_id", "letters, digits"),
    (lambda b: b.update(schema=2), "$.schema", "expected exactly 1"),
    (lambda b: b.update(schema=True), "$.schema", "expected exactly 1"),
    (lambda b: b.update(labels=None), "$.labels", "expected an object"),
    (lambda b: b.update(outcomes={"a": 1}), "$.outcomes", "expected an array"),
    # The A/B result.
    (lambda b: b.update(ab=None), "$.ab", "expected an object"),
    (lambda b: b["ab"]["metrics"].update(bogus_tps=b["ab"]["metrics"]["ttft_ms"]),
     "$.ab.metrics.bogus_tps", "unknown key"),
    (lambda b: b["ab"]["metrics"]["decode_tps"].update(verdict="worse"),
     "$.ab.metrics.decode_tps.verdict", "expected one of 'regressed', 'unchanged'"),
    # The history rule's words are no A/B verdicts.
    (lambda b: b["ab"]["metrics"]["decode_tps"].update(verdict="no baseline"),
     "$.ab.metrics.decode_tps.verdict", "'no baseline' is not allowed"),
    (lambda b: b["ab"]["metrics"]["decode_tps"].update(pairs="16"),
     "$.ab.metrics.decode_tps.pairs", "'16' is not allowed: expected an integer"),
    (lambda b: b["ab"]["metrics"]["decode_tps"].update(pairs=16.0),
     "$.ab.metrics.decode_tps.pairs", "expected an integer"),
    (lambda b: b["ab"]["metrics"]["decode_tps"].update(pairs=-1),
     "$.ab.metrics.decode_tps.pairs", "an integer from 0 to 2147483647"),
    (lambda b: b["ab"]["metrics"]["decode_tps"].update(ratio=0),
     "$.ab.metrics.decode_tps.ratio", "a number above 0 and at most 1e+15"),
    (lambda b: b["ab"]["metrics"]["decode_tps"].update(ci_low=-0.5),
     "$.ab.metrics.decode_tps.ci_low", "above 0"),
    (lambda b: b["ab"]["metrics"]["decode_tps"].update(ci_high="0.9"),
     "$.ab.metrics.decode_tps.ci_high", "expected a finite number or null"),
    (lambda b: b["ab"]["metrics"]["decode_tps"].update(ratio=True),
     "$.ab.metrics.decode_tps.ratio", "true is not allowed"),
    (lambda b: b["ab"]["metrics"]["decode_tps"].pop("ci_low"),
     "$.ab.metrics.decode_tps.ci_low", "required"),
    (lambda b: b["ab"]["metrics"]["decode_tps"].update(median=1.0),
     "$.ab.metrics.decode_tps.median", "unknown key"),
    (lambda b: b["ab"].update(threshold=0), "$.ab.threshold", "a number above 0 and at most 0.5"),
    (lambda b: b["ab"].update(threshold=0.6), "$.ab.threshold", "at most 0.5"),
    (lambda b: b["ab"].update(design="abba"), "$.ab.design", "expected one of 'sequential'"),
    (lambda b: b["ab"].update(baseline="b" * 1025), "$.ab.baseline", "1025 characters"),
    (lambda b: b["ab"].pop("counter_changes"), "$.ab.counter_changes", "required"),
    (lambda b: b["ab"].update(metrics=[]), "$.ab.metrics", "expected an object"),
    (lambda b: b["ab"]["counter_changes"][0].update(name="n" * 257),
     "$.ab.counter_changes[0].name", "257 characters are too many"),
    (lambda b: b["ab"]["counter_changes"][0].update(candidate="c" * 4097),
     "$.ab.counter_changes[0].candidate", "4097 characters are too many"),
    (lambda b: b["ab"]["counter_changes"][0].update(baseline=None),
     "$.ab.counter_changes[0].baseline", "expected a string"),
    (lambda b: b["ab"]["counter_changes"][0].update(baseline="a\x00b"),
     "$.ab.counter_changes[0].baseline", "without NUL"),
    (lambda b: b["ab"].update(counter_changes=[{"name": "x", "baseline": "1",
                                                "candidate": "2"}] * 1001),
     "$.ab.counter_changes", "1001 items are too many: expected at most 1000"),
], ids=lambda v: v if isinstance(v, str) else "")
def test_wrong_values_are_refused_naming_the_field(change: Any, field: str,
                                                   words: str) -> None:
    body = _body()
    change(body)
    error = _refused(json.dumps(body))
    assert error.field == field, error
    assert words in str(error), error
    # The same refusal for a body parsed elsewhere.
    with pytest.raises(RunRecordError) as caught:
        run_from_json(body)
    assert caught.value.field == field


def test_the_message_names_the_source_field_expectation_and_fix() -> None:
    body = _body()
    body["outcomes"][1]["outcome"] = None
    with pytest.raises(RunRecordError) as caught:
        parse_run_json(json.dumps(body), source="upload/run.json")
    message = str(caught.value)
    assert message.startswith("upload/run.json is not a harness run record: "
                              "$.outcomes[1].outcome: null is not allowed: expected one of")
    assert "RunRecord.to_json" in message
    assert isinstance(caught.value, HarnessError)
    assert isinstance(caught.value, ValueError)


def test_the_first_problem_by_path_is_reported_every_time() -> None:
    body = _body()
    body["outcomes"][0]["outcome"] = "boom"
    body["branch"] = 7
    body["hardware"]["cpu"] = None
    text = json.dumps(body)
    assert {_refused(text).field for _ in range(5)} == {"$.branch"}


@pytest.mark.parametrize(("data", "words"), [
    (b'{"run_id": "caf\xe9"}', "byte 15 is not UTF-8"),
    (b"\xef\xbb\xbf{}", "not valid JSON"),
    (b"", "not valid JSON"),
    (b'{"run_id": ', "not valid JSON"),
    (b"[]", "an array of 0 items is not allowed: expected an object"),
])
def test_documents_that_are_no_json_object_are_refused(data: bytes, words: str) -> None:
    error = _refused(data)
    assert error.field == "$"
    assert words in str(error)


def test_a_lone_surrogate_is_refused() -> None:
    error = _refused(_with("hardware.gpu", '"\\ud800"'))
    assert error.field == "$.hardware.gpu"
    assert "surrogate" in str(error)
    # A proper pair is just a character outside the BMP.
    assert parse_run_json(_with("hardware.gpu", '"\\ud83d\\ude00"')).hardware.gpu == "\U0001f600"


def test_a_repeated_key_is_refused() -> None:
    text = json.dumps(_body())
    error = _refused(text.replace('"branch":', '"branch": "main", "branch":', 1))
    assert error.field == "$.branch"
    assert "repeated key" in str(error)


def test_a_document_over_the_size_limit_is_refused_before_parsing() -> None:
    error = _refused(b" " * (MAX_DOCUMENT_BYTES + 1))
    assert error.field == "$"
    assert "too many" in str(error)


# -- records built in code --------------------------------------------------------------


@pytest.mark.parametrize(("run", "field"), [
    (make_run("nan", figures=[fig("decode_tps", math.nan)]), "$.figures[0].value"),
    (make_run("inf", outcomes=[outcome("t", duration_s=math.inf)]),
     "$.outcomes[0].duration_s"),
    (make_run("nul", outcomes=[outcome("t", "failed", message="a\x00b")]),
     "$.outcomes[0].message"),
    (make_run("bool", figures=[fig("kv_mib", 1.0, key=figure_key(n_prompt=True))]),
     "$.figures[0].key.n_prompt"),
    (make_run("bad id!"), "$.run_id"),
    (make_run("vram", hardware=replace(GPU_BOX, vram_mib=math.nan)),  # type: ignore[arg-type]
     "$.hardware.vram_mib"),
])
def test_check_run_refuses_records_built_in_code(run: RunRecord, field: str) -> None:
    with pytest.raises(RunRecordError) as caught:
        check_run(run)
    assert caught.value.field == field
    assert str(caught.value).startswith(f"run {run.run_id!r} is not a harness run record")


def test_run_record_error_survives_pickling() -> None:
    import pickle  # noqa: PLC0415 (only here)

    error = RunRecordError("run.json", "$.branch", "7 is not allowed")
    again = pickle.loads(pickle.dumps(error))
    assert (again.field, str(again)) == (error.field, str(error))


# -- properties ------------------------------------------------------------------------

_TEXT = st.text(st.characters(exclude_categories=["Cs"], exclude_characters="\x00"),
                max_size=12)
_COUNT = st.integers(min_value=0, max_value=2**31 - 1)
_KEYS = st.builds(FigureKey, fixture=_TEXT, backend=_TEXT, gpu=_TEXT, n_gpu_layers=_TEXT,
                  cache_type_k=_TEXT, cache_type_v=_TEXT, flash_attn=_TEXT, offload=_TEXT,
                  n_prompt=_COUNT, n_gen=_COUNT)
_RATIO = st.none() | st.floats(min_value=1e-9, max_value=1e15)
_AB = st.fixed_dictionaries({
    "baseline": _TEXT, "candidate": _TEXT, "design": st.sampled_from(AB_DESIGNS),
    "threshold": st.floats(min_value=1e-6, max_value=0.5),
    "metrics": st.dictionaries(st.sampled_from(sorted(METRICS)), st.fixed_dictionaries({
        "verdict": st.sampled_from(AB_VERDICTS), "pairs": _COUNT, "ratio": _RATIO,
        "ci_low": _RATIO, "ci_high": _RATIO}), max_size=3),
    "counter_changes": st.lists(st.fixed_dictionaries({
        "name": _TEXT, "baseline": _TEXT, "candidate": _TEXT}), max_size=2),
})
_SHAS = st.from_regex(r"[0-9a-f]{40}", fullmatch=True)
_SECONDS = st.floats(min_value=0, max_value=1e7)
_COMMITS = st.fixed_dictionaries({"sha": _SHAS, "subject": _TEXT})
_BISECT = st.fixed_dictionaries({
    "good": _SHAS, "bad": _SHAS, "oracle": _TEXT,
    "commits": st.integers(min_value=2, max_value=2**31 - 1), "reproduced": st.booleans(),
    "first_bad": st.none() | _COMMITS, "candidates": st.lists(_COMMITS, max_size=3),
    "stopped": st.none() | _TEXT,
    "probes": st.lists(st.fixed_dictionaries({
        "commit": _SHAS, "subject": _TEXT, "verdict": st.sampled_from(BISECT_VERDICTS),
        "evidence": _TEXT, "build_key": _TEXT, "build_s": _SECONDS, "judge_s": _SECONDS,
        "cache_hit": st.booleans()}, optional={
            name: st.floats(min_value=1e-6, max_value=1e6)
            for name in ("ratio", "ci_low", "ci_high")}), max_size=3),
})
_RUNS = st.builds(
    RunRecord,
    run_id=st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._-]{0,30}", fullmatch=True),
    branch=_TEXT, commit=_TEXT, started_at=_TEXT, finished_at=_TEXT,
    hardware=st.builds(Hardware, host=_TEXT, cpu=_TEXT, gpu=_TEXT,
                       gpu_driver=st.none() | _TEXT, vram_mib=st.none() | _COUNT),
    build=st.builds(BuildRef, backend=_TEXT, version=_TEXT, source_digest=_TEXT,
                    build_key=_TEXT, image_digest=st.none() | _TEXT),
    harness_version=_TEXT,
    outcomes=st.lists(st.builds(
        RunOutcome, test_id=_TEXT,
        outcome=st.sampled_from(list(Outcome)),
        duration_s=st.floats(min_value=0, max_value=1e7),
        message=st.none() | _TEXT), max_size=4).map(tuple),
    figures=st.lists(st.builds(
        Figure, test_id=_TEXT, key=_KEYS, metric=st.sampled_from(sorted(METRICS)),
        value=st.floats(min_value=0, max_value=1e15)), max_size=4).map(tuple),
    labels=st.dictionaries(_TEXT, _TEXT, max_size=3),
    ab=st.none() | _AB,
    bisect=st.none() | _BISECT,
    numerics=st.none() | st.dictionaries(_TEXT, st.fixed_dictionaries({
        "tokens": st.lists(_COUNT, max_size=3),
        "rows": st.lists(st.none() | st.dictionaries(
            _COUNT.map(str), st.floats(min_value=-1e6, max_value=0), max_size=3),
            max_size=3)}), max_size=2),
)


@settings(max_examples=50, deadline=None)
@given(_RUNS)
def test_valid_records_round_trip(run: RunRecord) -> None:
    check_run(run)
    assert parse_run_json(json.dumps(run.to_json(), allow_nan=False)) == run


_JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner,
                                                                max_size=3),
    max_leaves=6)


def _places(value: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every path to a value inside ``value``."""
    found = [path]
    items = value.items() if isinstance(value, dict) else (
        enumerate(value) if isinstance(value, list) else ())
    for key, item in items:
        found += _places(item, (*path, key))
    return found


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_the_quick_check_never_accepts_what_jsonschema_refuses(data: st.DataObject) -> None:
    # run_schema's quick check answers for jsonschema when it says yes; a yes jsonschema
    # would not give would let a broken run in.
    body: Any = _body()
    path = data.draw(st.sampled_from(_places(body)))
    replacement = data.draw(_JSON_VALUES)
    if not path:
        body = replacement
    else:
        node: Any = body
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = replacement
    if passes_quick_check(body):
        assert unrepresentable(body) is None
        assert list(RUN_VALIDATOR.iter_errors(body)) == []
