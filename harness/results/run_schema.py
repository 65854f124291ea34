"""The run record's JSON Schema (``run.json``): what a run record may hold, as data.

:data:`RUN_SCHEMA` is the one description of ``run.json``, with the limits of the
document around it (its size, its nesting, the digits of its integers). Reading and
checking a record against it is harness/results/run_validation.py's; the fast yes/no
form of it harness/results/schema_quick_check.py's.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from harness.results.rules import AbVerdict
from harness.results.run_record import METRICS, RUN_SCHEMA_VERSION, Outcome

#: The largest ``run.json`` read: a suite of 10 000 tests writes a few MB.
MAX_DOCUMENT_BYTES = 64 * 1024 * 1024
#: Containers nested deeper than this are refused before parsing (run.json needs 4).
MAX_DEPTH = 32
#: Integers longer than this are refused before conversion (int() is quadratic in the
#: digits); 20 digits hold any 64-bit integer.
MAX_INT_DIGITS = 20

# Every string: PostgreSQL's text cannot hold NUL, and the two backends must accept
# the same runs. (Python's $ also matches before a final newline; harmless here.)
NO_NUL = "^[^\\x00]*$"
# harness/service/layout.py's _RUN_ID: the id names the run's directory on the service.
# (?![\s\S]) rather than $, which in Python also matches before a final newline.
_RUN_ID = "^[A-Za-z0-9][A-Za-z0-9._-]{0,127}(?![\\s\\S])"
_COMMIT_ID = "^([0-9a-f]{40}|release:[0-9]{1,9})(?![\\s\\S])"
#: What each pattern asks for, in words, for messages.
PATTERN_WORDS = {
    NO_NUL: "text without NUL characters",
    _COMMIT_ID: "a 40-digit git commit id or release:<number>",
    _RUN_ID: "1-128 letters, digits, '.', '-' or '_', starting with a letter or digit",
}

#: Ids and names (branch, host, build key); longer free text (a CPU's or GPU's name, a
#: version line); a pytest node id, which parametrisation makes long; a failure message.
_NAME_CHARS = 256
_TEXT_CHARS = 1024
_TEST_ID_CHARS = 4096
_MESSAGE_CHARS = 64 * 1024
#: Bounds on counts: far above a real run, low enough that one upload cannot fill the store.
_MAX_ITEMS = 200_000
_MAX_LABELS = 256
#: figures.n_prompt / n_gen are Integer columns: int32 on PostgreSQL. (vram_mib too,
#: which is 2 PiB.)
_MAX_INT32 = 2**31 - 1
#: No test takes longer than this (about 115 days) and no figure is larger.
_MAX_DURATION_S = 1e7
_MAX_FIGURE = 1e15

#: The designs of harness/ab/design.py's DESIGNS, copied rather than imported (harness/ab
#: builds on this package); tests/test_run_schema.py holds them equal.
AB_DESIGNS = ("sequential", "interleaved", "duet", "alternating")
#: The A/B rule's verdicts, from their enum (harness/results/rules.py).
AB_VERDICTS = tuple(verdict.value for verdict in AbVerdict)
#: What a test's outcome may be, from the enum harness/plugin/recording/outcomes.py writes.
OUTCOMES = tuple(outcome.value for outcome in Outcome)
#: harness ab's --threshold goes up to 0.5 (a 50 % change).
_MAX_AB_THRESHOLD = 0.5
#: Counters that changed between two builds: a few dozen in practice (one per buffer
#: and kind, a few from the completion).
_MAX_COUNTER_CHANGES = 1000


def _text(max_chars: int, *, nullable: bool = False) -> dict[str, Any]:
    return {"type": ["string", "null"] if nullable else "string",
            "maxLength": max_chars, "pattern": NO_NUL}


def _object(required: Iterable[str], properties: dict[str, Any]) -> dict[str, Any]:
    # A closed set of keys: a typo'd field is an error, not a silently dropped value.
    return {"type": "object", "additionalProperties": False,
            "required": list(required), "properties": properties}


# A ratio of candidate to baseline (and its interval's bounds): null when too few pairs
# gave one, never 0 or below (both medians are positive speeds or times).
_AB_RATIO = {"type": ["number", "null"], "exclusiveMinimum": 0, "maximum": _MAX_FIGURE}

#: harness/numerics/fingerprint.py's NumericsVerdict, copied rather than imported (the
#: schema stays free of the numerics package); tests/test_run_schema.py holds them equal.
NUMERICS_VERDICTS = ("unchanged", "changed", "not measured")
_KLD = {"type": "number", "minimum": 0, "maximum": _MAX_FIGURE}
_POSITION = {"type": ["integer", "null"], "minimum": 0, "maximum": _MAX_INT32}

#: A fingerprint's generated positions (a numerics probe asks for 48) and the tokens a
#: row lists (harness/numerics/fingerprint.py RECORD_TOP_N: 16), with room to spare.
_MAX_FINGERPRINT_TOKENS = 4096
_MAX_ROW_TOKENS = 1024
#: Numerics probes in one run: a few dozen in practice.
_MAX_FINGERPRINTS = 10_000
_TOKEN_ID = {"type": "integer", "minimum": 0, "maximum": _MAX_INT32}
#: A row's keys are token ids written as decimal text, as Fingerprint.as_json writes them.
_TOKEN_ID_TEXT = {"type": "string", "maxLength": 10,
                  "pattern": "^(0|[1-9][0-9]{0,9})(?![\\s\\S])"}
#: A log-probability: never above 0; float32's smallest exponent is far above -1e6.
_LOGPROB = {"type": "number", "minimum": -1e6, "maximum": 0}
#: The run record's ``numerics``: test id -> fingerprint (Fingerprint.as_json).
_NUMERICS_SCHEMA = {
    "type": "object", "maxProperties": _MAX_FINGERPRINTS,
    "propertyNames": _text(_TEST_ID_CHARS),
    "additionalProperties": _object(["tokens", "rows"], {
        "tokens": {"type": "array", "maxItems": _MAX_FINGERPRINT_TOKENS, "items": _TOKEN_ID},
        "rows": {"type": "array", "maxItems": _MAX_FINGERPRINT_TOKENS, "items": {
            "type": ["object", "null"], "maxProperties": _MAX_ROW_TOKENS,
            "propertyNames": _TOKEN_ID_TEXT, "additionalProperties": _LOGPROB}},
    }),
}

#: The run record's ``ab`` object, as harness/ab/report.py's record_json writes it.
_AB_SCHEMA = _object(
    ["baseline", "candidate", "design", "threshold", "metrics", "counter_changes"], {
        "baseline": _text(_TEXT_CHARS),
        "candidate": _text(_TEXT_CHARS),
        "design": {"enum": list(AB_DESIGNS)},
        "threshold": {"type": "number", "exclusiveMinimum": 0,
                      "maximum": _MAX_AB_THRESHOLD},
        # Keyed by metric name, only the metrics the harness defines.
        "metrics": {"type": "object", "additionalProperties": False, "properties": {
            name: _object(["verdict", "pairs", "ratio", "ci_low", "ci_high"], {
                "verdict": {"enum": list(AB_VERDICTS)},
                "pairs": {"type": "integer", "minimum": 0, "maximum": _MAX_INT32},
                "ratio": _AB_RATIO, "ci_low": _AB_RATIO, "ci_high": _AB_RATIO,
                # Why a verdict is unknown though its interval says more (an unvalidated
                # design's "unchanged"); absent otherwise.
                "reason": _text(_TEXT_CHARS),
                # For an unknown, what would decide it (harness/ab/undecided.py); absent
                # for a verdict and in records written before it existed.
                "would_decide": _text(_TEXT_CHARS),
            }) for name in sorted(METRICS)}},
        # The metrics that leave the comparison undecided (`harness ab` exit 3): empty
        # when it is decided; absent in records written before the state existed.
        "undecided": {"type": "array", "maxItems": len(METRICS),
                      "items": {"enum": sorted(METRICS)}},
        "counter_changes": {"type": "array", "maxItems": _MAX_COUNTER_CHANGES,
                            "items": _object(["name", "baseline", "candidate"], {
                                "name": _text(_NAME_CHARS),
                                "baseline": _text(_TEST_ID_CHARS),
                                "candidate": _text(_TEST_ID_CHARS),
                            })},
        # The numbers' verdict (harness/numerics/fingerprint.py NumericsComparison); a
        # record written before it existed has none.
        "numerics": _object(
            ["verdict", "limit", "band_kld", "max_kld", "at", "first_token_difference",
             "reason"], {
                "verdict": {"enum": list(NUMERICS_VERDICTS)},
                "limit": _KLD, "band_kld": _KLD,
                "max_kld": {**_KLD, "type": ["number", "null"]},
                "at": _POSITION, "first_token_difference": _POSITION,
                "reason": _text(_TEXT_CHARS),
            }),
    })


#: A probe's verdict in harness/bisect/search.py's Verdict, copied rather than imported
#: (harness/bisect builds on this package); tests/test_run_schema.py holds them equal.
BISECT_VERDICTS = ("good", "bad", "skip", "undecided")
#: A bisect over a million commits probes about 20; a journal holds what was probed.
_MAX_PROBES = 1000
# A git commit, or a published release where a bisect ran over releases (release:<N>).
_SHA = {"type": "string", "pattern": _COMMIT_ID}
_COMMIT = _object(["sha", "subject"], {"sha": _SHA, "subject": _text(_TEXT_CHARS)})
_SECONDS = {"type": "number", "minimum": 0, "maximum": _MAX_DURATION_S}
_BISECT_RATIO = {"type": "number", "exclusiveMinimum": 0, "maximum": 1e6}

#: The run record's ``bisect`` object, as harness/bisect/bisector.py's record_json writes it.
_BISECT_SCHEMA = _object(
    ["good", "bad", "oracle", "commits", "reproduced", "first_bad", "candidates", "probes"], {
        "good": _SHA, "bad": _SHA,
        "oracle": _text(_TEXT_CHARS),
        "commits": {"type": "integer", "minimum": 2, "maximum": _MAX_INT32},
        "reproduced": {"type": "boolean"},
        # null while the first bad commit is not known (candidates are left).
        "first_bad": {**_COMMIT, "type": ["object", "null"]},
        "candidates": {"type": "array", "maxItems": _MAX_ITEMS, "items": _COMMIT},
        "stopped": _text(_TEXT_CHARS, nullable=True),
        "probes": {"type": "array", "maxItems": _MAX_PROBES, "items": _object(
            ["commit", "subject", "verdict", "evidence", "build_key", "build_s", "judge_s",
             "cache_hit"], {
                "commit": _SHA, "subject": _text(_TEXT_CHARS),
                "verdict": {"enum": list(BISECT_VERDICTS)},
                "evidence": _text(_MESSAGE_CHARS), "build_key": _text(_NAME_CHARS),
                "build_s": _SECONDS, "judge_s": _SECONDS,
                "cache_hit": {"type": "boolean"},
                # A measured probe (--metric): its ratio to the good build and the
                # interval's ends; absent for the other oracles.
                "ratio": _BISECT_RATIO, "ci_low": _BISECT_RATIO, "ci_high": _BISECT_RATIO,
            })},
    })


#: Candidates a tune proposes: a dozen in practice (one dimension at a time).
_MAX_TUNE_CANDIDATES = 1000
_TUNE_RATIO = {"type": ["number", "null"], "exclusiveMinimum": 0, "maximum": 1e6}
_TUNE_FIGURE = _object(["metric", "verdict", "ratio", "low", "high", "pairs"], {
    "metric": {"enum": sorted(METRICS)}, "verdict": {"enum": list(AB_VERDICTS)},
    "ratio": _TUNE_RATIO, "low": _TUNE_RATIO, "high": _TUNE_RATIO,
    "pairs": {"type": "integer", "minimum": 0, "maximum": _MAX_INT32}})
_DIFFERS = {"type": "array", "maxItems": 64, "items": _text(_TEXT_CHARS)}

#: The run record's ``tune`` object, as harness/tune/tune_record.py's record_json writes
#: it: a ``harness tune`` (or ``--check``) of the card's plan on this run's build.
_TUNE_SCHEMA = _object(
    ["card", "key", "context", "build_key", "check", "threshold", "stale", "current",
     "winner", "candidates", "summary"], {
        "card": _text(_NAME_CHARS), "key": _text(_NAME_CHARS),
        "context": _text(_NAME_CHARS), "build_key": _text(_NAME_CHARS),
        "check": {"type": "boolean"},
        "threshold": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
        "stale": {"type": "boolean"},
        "current": _DIFFERS,
        "winner": {**_object(["name", "differs", "figures"], {
            "name": _text(_NAME_CHARS), "differs": _DIFFERS,
            "figures": {"type": "array", "maxItems": 64, "items": _TUNE_FIGURE}}),
            "type": ["object", "null"]},
        "candidates": {"type": "array", "maxItems": _MAX_TUNE_CANDIDATES,
                       "items": _object(["name", "differs", "verdict", "figures"], {
                           "name": _text(_NAME_CHARS), "differs": _DIFFERS,
                           "verdict": _text(_TEXT_CHARS),
                           "figures": {"type": "array", "maxItems": 64,
                                       "items": _TUNE_FIGURE}})},
        "summary": _text(_MESSAGE_CHARS),
    })


#: ``run.json`` as :meth:`RunRecord.to_json` writes it. A field added later is optional
#: here (older runs lack it) and is read in harness/results/run_validation.py.
RUN_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "harness run record (run.json)",
    **_object(
        ["run_id", "branch", "commit", "started_at", "finished_at", "hardware", "build",
         "harness_version"],
        {
            "schema": {"const": RUN_SCHEMA_VERSION},
            "run_id": {"type": "string", "pattern": _RUN_ID},
            "branch": _text(_NAME_CHARS),
            "commit": _text(_NAME_CHARS),
            "started_at": _text(_NAME_CHARS),
            "finished_at": _text(_NAME_CHARS),
            "harness_version": _text(_NAME_CHARS),
            "hardware": _object(["host", "cpu"], {
                "host": _text(_NAME_CHARS),
                "cpu": _text(_TEXT_CHARS),
                "gpu": _text(_TEXT_CHARS),
                "gpu_driver": _text(_NAME_CHARS, nullable=True),
                "vram_mib": {"type": ["integer", "null"], "minimum": 0,
                             "maximum": _MAX_INT32},
            }),
            "build": _object(["backend", "version", "source_digest", "build_key"], {
                "backend": _text(_NAME_CHARS),
                "version": _text(_TEXT_CHARS),
                "source_digest": _text(_NAME_CHARS),
                "build_key": _text(_NAME_CHARS),
                "image_digest": _text(_NAME_CHARS, nullable=True),
            }),
            "outcomes": {"type": "array", "maxItems": _MAX_ITEMS, "items": _object(
                ["test_id", "outcome"], {
                    "test_id": _text(_TEST_ID_CHARS),
                    "outcome": {"enum": list(OUTCOMES)},
                    "duration_s": {"type": "number", "minimum": 0,
                                   "maximum": _MAX_DURATION_S},
                    "message": _text(_MESSAGE_CHARS, nullable=True),
                })},
            "figures": {"type": "array", "maxItems": _MAX_ITEMS, "items": _object(
                ["test_id", "key", "metric", "value"], {
                    "test_id": _text(_TEST_ID_CHARS),
                    "key": _object(
                        ["fixture", "backend", "gpu", "n_gpu_layers", "cache_type_k",
                         "cache_type_v", "flash_attn", "offload", "n_prompt", "n_gen"], {
                            "fixture": _text(_TEXT_CHARS),
                            "backend": _text(_NAME_CHARS),
                            "gpu": _text(_TEXT_CHARS),
                            "n_gpu_layers": _text(_NAME_CHARS),
                            "cache_type_k": _text(_NAME_CHARS),
                            "cache_type_v": _text(_NAME_CHARS),
                            "flash_attn": _text(_NAME_CHARS),
                            "offload": _text(_TEXT_CHARS),
                            "n_prompt": {"type": "integer", "minimum": 0,
                                         "maximum": _MAX_INT32},
                            "n_gen": {"type": "integer", "minimum": 0,
                                      "maximum": _MAX_INT32},
                        }),
                    # The recorder measures exactly these; a new metric is added there.
                    "metric": {"enum": sorted(METRICS)},
                    # Times, speeds and sizes: none is negative.
                    "value": {"type": "number", "minimum": 0, "maximum": _MAX_FIGURE},
                    # The bandwidth model's decode speed beside a measured decode_tps,
                    # and value / predicted: recorded, never gated.
                    "predicted": {"type": "number", "exclusiveMinimum": 0,
                                  "maximum": _MAX_FIGURE},
                    "ratio": {"type": "number", "minimum": 0, "maximum": _MAX_FIGURE},
                })},
            "labels": {"type": "object", "maxProperties": _MAX_LABELS,
                       "propertyNames": _text(_NAME_CHARS),
                       "additionalProperties": _text(_TEST_ID_CHARS)},
            "ab": _AB_SCHEMA,
            "bisect": _BISECT_SCHEMA,
            "tune": _TUNE_SCHEMA,
            "numerics": _NUMERICS_SCHEMA,
        }),
}


def type_list(types: str | list[str]) -> list[str]:
    """A schema's ``type`` keyword as a list of JSON type names."""
    return [types] if isinstance(types, str) else types
