"""The vision route: a projector planned with the model, loaded with ``--mmproj``, and an
image answered through ``/v1/chat/completions``.

The projector is the fixtures' ``dense-mmproj`` (harness/modelgen/projector.py: a tiny
LLaVA-style CLIP file for the ``dense`` model), which the real server loads and runs: the
image's 16 patches become 16 prompt positions beside the text's. Where the projector was
placed and how large it is are checked against the plan in suites/test_plan_forwarding.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from harness import modelgen
from harness.builds.under_test import BuildUnderTest
from harness.client import ServerClient, image_message
from harness.modelgen.projector import gradient_png
from harness.planning.drafter import BrokenDrafters
from harness.plugin import LaunchPlanned, PlanFor
from harness.probes.gguf_facts import read_model_facts
from harness.runners.subprocess_runner import SubprocessRunner
from harness.supervise.strikes import StrikeBook
from harness.supervise.supervisor import LaunchFailedError, LaunchSupervisor
from harness.verdicts.failure import FailureClass

pytestmark = pytest.mark.server

#: The projector's image side: 32 x 32 pixels in 8 x 8 patches.
IMAGE = gradient_png(32)
QUESTION = "what is in the picture?"


def test_an_image_is_answered_through_the_planned_projector(
        plan_for: PlanFor, launch: LaunchPlanned, fixture_set: modelgen.FixtureSet) -> None:
    projector = fixture_set.projector("dense-mmproj")
    plan = plan_for(model="dense", projector=projector, per_call={"ctx_size": 1024})
    assert plan.spec.mmproj == projector
    assert plan.origins["mmproj"] == "vision"
    server = launch(plan)
    with ServerClient(server.base_url) as client:
        seen = client.chat([image_message(QUESTION, IMAGE)], max_tokens=4)
        text_only = client.chat([{"role": "user", "content": QUESTION}], max_tokens=4)
    answer = seen["choices"][0]["message"]["content"]
    assert isinstance(answer, str)
    assert answer, seen
    assert seen["usage"]["completion_tokens"] == 4
    # The image became prompt positions of its own: one per patch, (32 / 8)^2.
    added = seen["usage"]["prompt_tokens"] - text_only["usage"]["prompt_tokens"]
    assert added >= 16, (seen["usage"], text_only["usage"])
    assert "image decoded" in server.log_text()


def test_a_projector_that_does_not_load_fails_naming_the_file(
        plan_for: PlanFor, server_runner: SubprocessRunner, harness_build: BuildUnderTest,
        fixture_set: modelgen.FixtureSet, tmp_path: Path) -> None:
    whole = fixture_set.projector("dense-mmproj").read_bytes()
    cut = tmp_path / "cut-mmproj.gguf"
    cut.write_bytes(whole[: len(whole) // 2])
    plan = plan_for(model="dense", projector=cut, per_call={"ctx_size": 1024})
    supervisor = LaunchSupervisor(server_runner, harness_build.key, BrokenDrafters(),
                                  read_model_facts(plan.spec.model),
                                  strikes=StrikeBook(tmp_path / "strikes"))
    with pytest.raises(LaunchFailedError) as failed:
        supervisor.launch(plan)
    error = failed.value
    assert error.failure.kind is FailureClass.PROJECTOR_LOAD, error.failure
    assert str(cut) in error.failure.evidence
    assert len(error.attempts) == 1, "a projector that does not load is not retried"
    assert "--mmproj" in str(error)
