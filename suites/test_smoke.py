"""Smoke: every fixture meant to load serves, drafters speculate, a broken drafter fails.

Each test starts a real llama-server built from the pinned source on a GGUF written by
the fixture code, and checks what the server itself reports.
"""

from __future__ import annotations

import pytest

from harness import modelgen
from harness.client import ServerClient
from harness.errors import ServerExitedError
from harness.facts.catalog import RuntimeClass
from harness.planning.launch import LaunchSpec
from harness.plugin import BundleDir, StartServer
from harness.probes.bundles import load_bundle

pytestmark = pytest.mark.server

#: Fixtures that are complete models (drafter-corrupt is truncated on purpose).
SERVING_FIXTURES = ("dense", "moe", "drafter", "drafter-foreign", "swa", "mtp")
PROMPT = "Once upon a time"
#: Random weights may pick the end-of-text token; ignore it so the count is exact.
EXACT = {"ignore_eos": True}


@pytest.mark.parametrize("name", SERVING_FIXTURES)
def test_fixture_serves(name: str, fixture_set: modelgen.FixtureSet,
                        start_server: StartServer) -> None:
    model = fixture_set.model(name)
    server = start_server(LaunchSpec(model=model, ctx_size=512, parallel=2))
    with ServerClient(server.base_url) as client:
        props = client.props()
        assert props.model_path == str(model)
        assert props.total_slots == 2
        first = client.completion(PROMPT, n_predict=8, **EXACT)
        again = client.completion(PROMPT, n_predict=8, **EXACT)
    assert first.tokens_predicted == 8
    assert first.content, "the server predicted 8 tokens but returned no text"
    assert again.content == first.content, "temperature 0 must be deterministic"


def test_compatible_drafter_speculates(fixture_set: modelgen.FixtureSet,
                                       start_server: StartServer) -> None:
    server = start_server(LaunchSpec(
        model=fixture_set.model("dense"), ctx_size=512, parallel=1,
        spec_type="draft-simple", drafter=fixture_set.model("drafter"),
    ))
    assert "common_speculative_init_result: loading draft model" in server.log_text()
    with ServerClient(server.base_url) as client:
        completion = client.completion(PROMPT, n_predict=16, **EXACT)
    assert completion.timings.draft_n is not None
    assert completion.timings.draft_n > 0
    # The fixtures are built to agree on one token, so drafts are accepted too.
    assert completion.timings.draft_n_accepted is not None
    assert completion.timings.draft_n_accepted > 0


def test_mtp_head_speculates(fixture_set: modelgen.FixtureSet,
                             start_server: StartServer) -> None:
    server = start_server(LaunchSpec(model=fixture_set.model("mtp"), ctx_size=512, parallel=1,
                                     spec_type="draft-mtp"))
    assert "draft-mtp" in server.log_text()
    with ServerClient(server.base_url) as client:
        completion = client.completion(PROMPT, n_predict=16, **EXACT)
    assert completion.timings.draft_n is not None
    assert completion.timings.draft_n > 0


def test_corrupt_drafter_fails_the_start_in_the_servers_words(
        fixture_set: modelgen.FixtureSet, start_server: StartServer) -> None:
    with pytest.raises(ServerExitedError) as failure:
        start_server(LaunchSpec(model=fixture_set.model("dense"), ctx_size=512,
                                spec_type="draft-simple",
                                drafter=fixture_set.model("drafter-corrupt")))
    message = str(failure.value)
    assert "failed to load draft model" in message
    assert "exit code 1" in message


def test_fused_bundle_serves_with_its_catalog_entry(any_bundle: str, bundle_dir: BundleDir,
                                                    start_server: StartServer) -> None:
    """Every bundle: the fixtures' and the user's (``--harness-bundles``)."""
    bundle = load_bundle(bundle_dir(any_bundle))
    entry = bundle.entry
    assert entry.runtime_class is RuntimeClass.FUSED
    server = start_server(LaunchSpec(
        model=bundle.text_model, ctx_size=entry.context_length, parallel=1,
        cache_type_k=entry.cache_type_k, cache_type_v=entry.cache_type_v,
        spec_type=entry.spec_type, drafter=bundle.drafter_path,
    ))
    with ServerClient(server.base_url) as client:
        assert client.props().model_path == str(bundle.text_model)
        completion = client.completion(PROMPT, n_predict=16, **EXACT)
    assert completion.tokens_predicted == 16
    if entry.spec_type:
        assert completion.timings.draft_n is not None
        assert completion.timings.draft_n > 0
