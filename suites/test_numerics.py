"""Numerics: what the build computes, held to an independent reference.

Every other suite checks how a server was launched and what it logged; this one checks
the numbers. For each fixture (peaked weights, and quantized copies in q8_0, q4_0 and
q4_1) and each KV cache type the fixture's head width allows, the server completes a
fixed prompt greedily and reports its pre-sampling distribution over the whole
vocabulary at each generated position (``n_probs`` = vocabulary size, no drafter:
accepted draft tokens carry no probabilities). ``harness.reference`` — numpy, reading
the same GGUF through gguf-py, sharing no code with llama.cpp — computes the
distribution along the server's own tokens (teacher-forced), and each position's KL
divergence and top token are held to ``harness.numerics.thresholds``. The prompt and
the generation run past 128 positions, so rotary positions and the sliding window of
``swa`` (32) are exercised.

The real model (SmolLM2-135M-Instruct, Q4_1, 49,152 tokens; ``harness fixtures --real``)
is held to the reference the same way on a fixed English text through ``/completion``
and on a fixed question through ``/v1/chat/completions`` with its own chat template.
Its server lists its top ``REAL_TOP_N`` tokens a position; the rest of the vocabulary is
one outcome in the KL divergence (``harness.numerics.divergence``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from functools import cache
from pathlib import Path

import allure
import pytest

from harness import modelgen
from harness.builds.resolve import pinned_cpu_build
from harness.builds.tools import build_tool
from harness.builds.under_test import BuildUnderTest
from harness.client import ServerClient
from harness.errors import HarnessError
from harness.modelgen.fixture_data import load_all
from harness.modelgen.kquant import KQUANT_TYPES, kquant_copy
from harness.modelgen.real_model import FETCH_HINT, SMOLLM2, real_model_path
from harness.modelgen.specs import FixtureSpec, WeightType
from harness.numerics.eval_callback import locate_divergence
from harness.numerics.fingerprint import record_fingerprint_of
from harness.numerics.probabilities import ReportedDistributions, parse_chat_distributions
from harness.numerics.probe import against_reference, greedy_distributions
from harness.numerics.thresholds import KV_TYPES, Threshold, kquant_threshold, threshold
from harness.numerics.token_bytes import read_token_bytes
from harness.numerics.verdict import judge
from harness.paths import cache_root
from harness.planning.launch import LaunchSpec
from harness.plugin import RecordFingerprint, StartServer
from harness.plugin.required import skip_unless_present
from harness.reference import ReferenceModel, load_reference

pytestmark = pytest.mark.server

#: The real model's tier: about 128 tokens of plain English, then a short continuation;
#: and one question through the chat endpoint.
REAL_TEXT = (
    "On the morning the river froze, the children of the village ran down to the bank to "
    "see it. The ice was clear in places and white in others, and under the clear parts "
    "they could see the water still moving, slow and dark. Their grandmother told them "
    "that the river never sleeps, even in the coldest winter; it only pulls a blanket "
    "over itself and keeps walking underneath. Nobody was allowed onto the ice until the "
    "baker's son, who was the heaviest person in the village, had tested it with a long "
    "pole and declared it safe. By noon"
)
REAL_QUESTION = [{"role": "user", "content": "Name three colours of the rainbow."}]
REAL_PREDICT = 24
#: Tokens the real model's server lists a position (of 49,152): the rest is one outcome.
REAL_TOP_N = 256
#: A quantized cache stores keys in blocks of 32 values, so a head must be a multiple.
KV_BLOCK = 32


def _numerics_specs() -> dict[str, FixtureSpec]:
    """The fixtures that can show a wrong number: generated models with peaked weights
    and their quantized copies, plus the aligned ones whose near-certain top token still
    carries a full distribution (dense, its copies, mtp's trunk)."""
    fixtures, _ = load_all()
    serving = {"dense", "moe", "bench", "swa", "mtp"}
    return {name: spec for name, spec in fixtures.items()
            if spec.shape is not None and (name in serving or spec.quantized_from in serving)}


def _cases() -> list[tuple[str, str]]:
    cases = []
    for name, spec in _numerics_specs().items():
        assert spec.shape is not None
        for kv in KV_TYPES:
            if kv == "f16" or spec.shape.key_length % KV_BLOCK == 0:
                cases.append((name, kv))
    return cases


@cache
def _reference(path: Path) -> ReferenceModel:
    return load_reference(path)


@cache
def _token_bytes(path: Path) -> tuple[bytes, ...]:
    return read_token_bytes(path)


@pytest.mark.parametrize(("name", "kv"), _cases())
def test_distributions_match_the_reference(name: str, kv: str, *,
                                           fixture_set: modelgen.FixtureSet,
                                           harness_build: BuildUnderTest,
                                           start_server: StartServer,
                                           record_fingerprint: RecordFingerprint) -> None:
    spec = _numerics_specs()[name]
    model = fixture_set.model(name)
    reference, token_bytes = _reference(model), _token_bytes(model)
    server = start_server(LaunchSpec(model=model, ctx_size=512, parallel=1,
                                     cache_type_k=kv, cache_type_v=kv))
    with ServerClient(server.base_url) as client:
        prompt, reported = greedy_distributions(client, reference.n_vocab, token_bytes)
    # The sequence must reach past 128 positions (rotary angles, the window); a
    # tokenizer that packs the prompt tighter would silently shorten the probe.
    assert len(prompt) + len(reported.generated) > 128, f"{name}: too few positions"
    _hold_to_reference(f"{name} ({spec.weight_type.value} weights, KV {kv})",
                       threshold(spec.weight_type, kv, harness_build.backend),
                       prompt=prompt, reported=reported, reference=reference,
                       token_bytes=token_bytes, record=record_fingerprint,
                       where=lambda: _where_it_parts(harness_build, model))


def _hold_to_reference(label: str, limit: Threshold, *,
                       prompt: list[int], reported: ReportedDistributions,
                       reference: ReferenceModel, token_bytes: tuple[bytes, ...],
                       record: RecordFingerprint,
                       where: Callable[[], str] | None = None) -> None:
    """The reference along the server's own tokens, each reported position's figures
    attached to the report and held to the threshold; on a failure, ``where`` says
    where the build's forward pass parts from another's. The probe's fingerprint goes
    to the run record first, so ``harness compare`` sees a failing build's numbers too."""
    record(record_fingerprint_of(reported))
    result = against_reference(prompt, reported, reference)
    summary = result.summary
    allure.attach(json.dumps({"probe": label, **summary.as_dict(),
                              "max_kld_limit": limit.max_kld, "min_top1_limit": limit.min_top1,
                              "generated": list(reported.generated)}, indent=2),
                  "numerics", allure.attachment_type.JSON)
    failures = judge(label, result.figures, summary, limit, token_bytes)
    if failures and where is not None:
        failures.append(where())
        allure.attach(failures[-1], "where the numbers part", allure.attachment_type.TEXT)
    assert not failures, "\n".join(failures)


#: The forward pass the divergence is located on: the probe's first words.
WHERE_PROMPT = "The old lighthouse keeper"


def _where_it_parts(build: BuildUnderTest, model: Path) -> str:
    """The first tensor of a forward pass where the build under test leaves the pinned
    CPU build (``harness/numerics/eval_callback.py``), or why it cannot be said."""
    pinned = pinned_cpu_build(cache_root())
    folder = build.binary.parent.parent
    if pinned is None:
        return "not located: no cached CPU build of the pinned source to compare with " \
               "(`harness build`)"
    if not (folder / "cmake-build").is_dir():
        return f"not located: {build.binary} is not in a native build folder of the cache"
    if folder.resolve() == pinned.directory.resolve():
        return "not located: this is the pinned build itself, so there is no build to " \
               "part from; its numbers left the reference"
    try:
        found = locate_divergence(pinned.directory, folder, model, WHERE_PROMPT, os.environ)
    except HarnessError as exc:
        return f"not located: {exc}"
    if found is None:
        return (f"against the pinned build: every tensor of a forward pass of "
                f"{WHERE_PROMPT!r} agrees (the difference is in what that pass does not "
                "reach: a longer context, the KV cache's later positions, or sampling)")
    return f"against the pinned build: {found.describe()}"


@pytest.mark.parametrize("qtype", KQUANT_TYPES)
def test_kquant_copies_match_the_reference(qtype: str, fixture_set: modelgen.FixtureSet,
                                           harness_build: BuildUnderTest,
                                           start_server: StartServer,
                                           record_fingerprint: RecordFingerprint) -> None:
    """``bench`` in Q4_K and Q6_K, quantized by the pinned build's llama-quantize."""
    pinned = pinned_cpu_build(cache_root())
    if pinned is None:
        pytest.skip("the K-quant copies are made by the pinned CPU build's llama-quantize, "
                    "and this machine has no such build cached (`harness build`)")
    model = kquant_copy(fixture_set.model("bench"), qtype,
                        build_tool(pinned.directory, "llama-quantize"))
    reference, token_bytes = _reference(model), _token_bytes(model)
    server = start_server(LaunchSpec(model=model, ctx_size=512, parallel=1))
    with ServerClient(server.base_url) as client:
        prompt, reported = greedy_distributions(client, reference.n_vocab, token_bytes)
    _hold_to_reference(f"bench-{qtype.lower()} ({qtype} weights, KV f16)",
                       kquant_threshold("f16", harness_build.backend),
                       prompt=prompt, reported=reported, reference=reference,
                       token_bytes=token_bytes, record=record_fingerprint,
                       where=lambda: _where_it_parts(harness_build, model))


@pytest.fixture(scope="module")
def real_model() -> Path:
    path = real_model_path()
    skip_unless_present("real-model", None if path is not None else
                        f"the real model {SMOLLM2.requirement} is not in the cache: "
                        f"{FETCH_HINT}")
    assert path is not None
    return path


#: The real model is Q4_1 but for one Q8_0 tensor (docs/design.md): the quantized limit.
REAL_WEIGHTS = WeightType.Q4_1


def test_real_model_text_matches_the_reference(real_model: Path,
                                               harness_build: BuildUnderTest,
                                               start_server: StartServer,
                                               record_fingerprint: RecordFingerprint) -> None:
    reference, token_bytes = _reference(real_model), _token_bytes(real_model)
    server = start_server(LaunchSpec(model=real_model, ctx_size=512, parallel=1))
    with ServerClient(server.base_url) as client:
        prompt, reported = greedy_distributions(client, reference.n_vocab, token_bytes,
                                                prompt=REAL_TEXT, n_predict=REAL_PREDICT,
                                                top_n=REAL_TOP_N)
    assert 110 <= len(prompt) <= 150, f"the text is {len(prompt)} tokens, meant ~128"
    _hold_to_reference("SmolLM2-135M text (q4_1 weights, KV f16)",
                       threshold(REAL_WEIGHTS, "f16", harness_build.backend),
                       prompt=prompt, reported=reported, reference=reference,
                       token_bytes=token_bytes, record=record_fingerprint)


def test_real_model_chat_matches_the_reference(real_model: Path,
                                               harness_build: BuildUnderTest,
                                               start_server: StartServer,
                                               record_fingerprint: RecordFingerprint) -> None:
    reference, token_bytes = _reference(real_model), _token_bytes(real_model)
    server = start_server(LaunchSpec(model=real_model, ctx_size=512, parallel=1))
    with ServerClient(server.base_url) as client:
        prompt = client.tokenize(client.apply_template(REAL_QUESTION))
        answer = client.chat(REAL_QUESTION, max_tokens=REAL_PREDICT, logprobs=True,
                             top_logprobs=REAL_TOP_N)
    reported = parse_chat_distributions(answer, reference.n_vocab)
    text = b"".join(token_bytes[t] for t in reported.generated).decode("utf-8", "replace")
    allure.attach(text, "chat answer", allure.attachment_type.TEXT)
    _hold_to_reference("SmolLM2-135M chat (q4_1 weights, KV f16)",
                       threshold(REAL_WEIGHTS, "f16", harness_build.backend),
                       prompt=prompt, reported=reported, reference=reference,
                       token_bytes=token_bytes, record=record_fingerprint)
