"""A test's plans, servers and retries as plain JSON and text (pure).

These are what the Allure attachments hold; building them apart from the Allure calls
keeps them testable without a report.
"""

from __future__ import annotations

from typing import Any

from harness.plugin.recording.recorder import ServerRecord, SupervisedStory
from harness.verdicts.failure import classify_start_failure
from harness.verdicts.gpu_use import gpu_verdict
from harness.verdicts.residency import residency_json, residency_verdict

#: A passing test keeps the head (model load, devices, buffers) and the tail of each log.
TRIM_HEAD_LINES = 80
TRIM_TAIL_LINES = 40

#: Suite module → the feature it gates, as the report's Behaviors tab shows it.
FEATURES = {
    "test_smoke": "smoke",
    "test_routing": "routing",
    "test_plan_forwarding": "plan forwarding",
    "test_drafter_fallback": "drafter fallback",
    "test_gpu_unused": "GPU-unused detection",
    "test_offload_ladders": "offload ladders",
}


def feature_of(module: str) -> str:
    return FEATURES.get(module, module.removeprefix("test_").replace("_", " "))


def trimmed_log(text: str, *, whole: bool) -> str:
    """The whole log for a failure; head and tail with a marker between for a pass."""
    if whole:
        return text
    lines = text.splitlines()
    if len(lines) <= TRIM_HEAD_LINES + TRIM_TAIL_LINES:
        return text
    left_out = len(lines) - TRIM_HEAD_LINES - TRIM_TAIL_LINES
    return "\n".join([*lines[:TRIM_HEAD_LINES],
                      f"… {left_out} lines left out (the test passed; a failure keeps them) …",
                      *lines[-TRIM_TAIL_LINES:]]) + "\n"


def verdicts_json(record: ServerRecord, log_text: str, backend: str) -> dict[str, Any]:
    """The GPU-use verdict, where the weights and KV sit (MiB per buffer, the ``ollama ps``
    share), and how the start failed when the server did not serve."""
    verdict = gpu_verdict(log_text, backend)
    body: dict[str, Any] = {
        "gpu_use": {
            "passed": verdict.passed,
            "reason": verdict.reason,
            "blocks": [{"role": b.role.value, "state": b.state.value, "device": b.device,
                        "explanation": b.explanation, "offload_mismatch": b.offload_mismatch}
                       for b in verdict.blocks],
            "warnings": list(verdict.warnings),
        },
        "residency": residency_json(residency_verdict(log_text)),
        "served": record.ready_at is not None,
        "exit_code": record.exit_code,
    }
    if record.ready_at is None:
        failure = classify_start_failure(record.exit_code, log_text, timed_out=False)
        body["start_failure"] = {"class": failure.kind.value, "evidence": failure.evidence}
    return body


def attempts_json(story: SupervisedStory) -> dict[str, Any]:
    """Each supervisor attempt: its command line, failure class and what came next."""
    return {
        "notes": list(story.notes),
        "attempts": [{
            "number": attempt.number,
            "rung": attempt.rung.label,
            "argv": list(attempt.argv),
            "failure": None if attempt.failure is None else {
                "class": attempt.failure.kind.value,
                "evidence": attempt.failure.evidence,
                "exit_code": attempt.failure.exit_code},
            "action": attempt.action,
        } for attempt in story.attempts],
    }


def figures_json(record: ServerRecord) -> dict[str, Any]:
    return {
        "key": None if record.key is None else vars(record.key),
        "figures": record.figures,
        "error": record.measure_error,
    }
