"""The run-level files of an allure-results folder: environment and failure categories (pure).

The plugin writes both at session end. ``environment.properties`` is read by Allure's
own Java-properties parser, so keys and values are escaped the way
``java.util.Properties.store`` escapes them. The categories sort failures by cause;
their regexes are written against the harness's own messages (the modules each category
names), and ``category_of`` applies them in Python exactly as Allure 3 does
(``@allurereport/core-api`` ``matchCategory``): rules in order, the first that matches
wins, a regex matches anywhere in the text (JavaScript ``RegExp.test``, Python
``re.search``), and a rule with both a message and a trace regex needs both. Allure 3
files whatever no rule takes under its own "Product errors" (failed) and "Test errors"
(broken).

The regexes stay in the syntax both engines read alike: no inline flags, no named groups,
no lookbehind.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.files import atomic_write_bytes

ENVIRONMENT_FILE = "environment.properties"
CATEGORIES_FILE = "categories.json"

#: Allure's test statuses a category can match (``passed`` never does here, ``skipped``
#: only for a known flake).
FAILED = "failed"
BROKEN = "broken"
SKIPPED = "skipped"
_PROBLEM_STATUSES = (FAILED, BROKEN)


@dataclass(frozen=True)
class Matcher:
    """One way into a category: the statuses, and regexes the message / trace must contain."""

    statuses: tuple[str, ...] = _PROBLEM_STATUSES
    message_regex: str | None = None
    trace_regex: str | None = None

    def matches(self, message: str, trace: str, status: str) -> bool:
        if status not in self.statuses:
            return False
        if self.message_regex is not None and not re.search(self.message_regex, message):
            return False
        return self.trace_regex is None or re.search(self.trace_regex, trace) is not None


@dataclass(frozen=True)
class Category:
    """A named failure class; any one of its matchers lets a test in."""

    name: str
    matchers: tuple[Matcher, ...]

    def matches(self, message: str, trace: str, status: str) -> bool:
        return any(m.matches(message, trace, status) for m in self.matchers)

    def to_json(self) -> list[dict[str, Any]]:
        """One ``categories.json`` rule per matcher, all under this name.

        Allure 3 merges rules that share a name (its id) into one category whose matchers
        are alternatives, at the position of the first; the rules stay adjacent here, so
        the merged order is this order.
        """
        rules = []
        for matcher in self.matchers:
            rule: dict[str, Any] = {"name": self.name,
                                    "matchedStatuses": list(matcher.statuses)}
            if matcher.message_regex is not None:
                rule["messageRegex"] = matcher.message_regex
            if matcher.trace_regex is not None:
                rule["traceRegex"] = matcher.trace_regex
            rules.append(rule)
        return rules


def _any(*patterns: str) -> str:
    return "|".join(patterns)


def _suite_assertion(suite_file: str) -> str:
    # pytest's long report ends each frame with "<path>:<line>: <ExceptionType>"; an
    # AssertionError raised in the suite file itself is that suite's own check failing.
    return re.escape(suite_file) + r":\d+: AssertionError"


BUILD_FAILURE = Category("Build failure", (Matcher(message_regex=_any(
    # harness.errors: the build, its source and its tools (allure-pytest prefixes the
    # message with the exception's qualified name).
    r"\b(?:BuildError|SourceError|SourceHashMismatchError|ToolMissingError)\b",
    # harness/plugin.py, when the build or the image under test cannot be had.
    r"no build under test",
    r"no llama-server image for the container runner",
)),))

INFRASTRUCTURE = Category("Infrastructure / timeout", (Matcher(message_regex=_any(
    # harness/runners/readiness.py: "llama-server was not ready after 60s: still ...".
    r"was not ready after \d",
    r"\bServerNotReadyError\b",
    # harness/verdicts/failure.py's class, as LaunchFailedError quotes it.
    r"\breadiness-timeout\b",
    # pytest-timeout: "Timeout (>600.0s) from pytest-timeout."
    r"Timeout \(>[\d.]+s\) from pytest-timeout",
    r"\btimed out\b",
    # harness/probes/docker_engine.py and harness/runners/container_runner.py.
    r"no Docker engine answers",
    r"docker could not start a llama-server container",
)),))

DRAFTER_FALLBACK = Category("Drafter fallback", (
    Matcher(message_regex=_any(
        # llama.cpp's words, quoted by the supervisor (harness/verdicts/failure.py).
        r"failed to load draft model",
        r"failed to create MTP context",
        # harness/verdicts/failure.py FailureClass, by value and by name.
        r"\bdrafter-load\b",
        r"\bmtp-context\b",
        r"\bDRAFTER_LOAD\b",
        r"\bMTP_CONTEXT\b",
        # harness/supervise/supervisor.py and harness/planning/drafter.py.
        r"retried without speculative decoding",
        r"it broke an earlier start",
        r"leaving the drafter \S+ out",
        r"spec type draft-mtp \([^)]*\) dropped",
    )),
    Matcher(trace_regex=_suite_assertion("test_drafter_fallback.py")),
))

OUT_OF_MEMORY = Category("Out of memory / offload", (
    Matcher(message_regex=_any(
        r"\bout-of-memory\b",
        r"\bOUT_OF_MEMORY\b",
        r"\bout of memory\b",
        # llama.cpp's allocation failures (harness/verdicts/failure.py lists where).
        r"cudaMalloc failed",
        r"unable to allocate \S+ buffer",
        r"failed to allocate \S+ buffer of size \d+",
        r"Device memory allocation of size \d+ failed",
        r"ErrorOutOfDeviceMemory",
        # harness/supervise/supervisor.py: "... every rung of the offload ladder ...".
        r"offload ladder",
    )),
    Matcher(trace_regex=_suite_assertion("test_offload_ladders.py")),
))

GPU_UNUSED = Category("GPU unused", (
    Matcher(message_regex=_any(
        # harness/verdicts/gpu_use.py GpuVerdict.reason: "<role>: <state> — <why>".
        r"\b(?:target|drafter): (?:init-failed|no-devices|not-loaded|not-offloaded"
        r"|software-device|no-usable-gpu|undecidable) — ",
        r"\bGpuState\.(?:INIT_FAILED|NO_DEVICES|NOT_LOADED|NOT_OFFLOADED|SOFTWARE_DEVICE"
        r"|NO_USABLE_GPU|UNDECIDABLE)\b",
        # llama.cpp: the GPU backend came up without a device.
        r"ggml_cuda_init: failed to initialize (?:CUDA|ROCm|MUSA)",
        # harness/verdicts/failure.py: a CUDA build started without the NVIDIA driver.
        r"\bdriver-missing\b",
        r"\bDRIVER_MISSING\b",
        r"libcuda\.so\.1: cannot open shared object file",
        r"ggml_vulkan: No devices found",
        # harness/plugin.py, --harness-require-gpu without the device.
        r"this run requires (?:cuda|rocm|vulkan|sycl|metal): ",
        r"--list-devices shows no \S+ device",
    )),
    Matcher(trace_regex=_suite_assertion("test_gpu_unused.py")),
    Matcher(trace_regex=_suite_assertion("test_gpu_unused_images.py")),
))

PLAN_FORWARDING = Category("Plan-forwarding mismatch", (
    Matcher(message_regex=_any(
        # suites/test_plan_forwarding.py and harness/verdicts/plan_check.py Mismatch.
        r"the server does not report the plan",
        r"\S+: planned .+, observed ",
    )),
    Matcher(trace_regex=_suite_assertion("test_plan_forwarding.py")),
))

KNOWN_FLAKE = Category("Known flake", (Matcher(
    statuses=(SKIPPED,),
    # harness/recording/flakes_plugin.py makes a listed failure an xfail whose reason
    # starts "known flake: "; allure-pytest records it as skipped, "XFAIL <reason>".
    message_regex=r"^XFAIL known flake: "),))

#: In the order they are tried. Causes that make everything after them moot come first
#: (no build, no server); the drafter before out-of-memory, as the supervisor classifies a
#: start (a drafter that does not fit prints the OOM lines too); GPU use after both, since
#: a failed start's quoted log can carry a GPU backend's complaints; the plan check last.
#: Known flakes (skipped results only) share no status with the rest; they come first.
CATEGORIES: tuple[Category, ...] = (KNOWN_FLAKE, BUILD_FAILURE, INFRASTRUCTURE,
                                    DRAFTER_FALLBACK, OUT_OF_MEMORY, GPU_UNUSED,
                                    PLAN_FORWARDING)


def categories_json(categories: tuple[Category, ...] = CATEGORIES) -> list[dict[str, Any]]:
    """The rules as Allure reads them (``categories.json``, or the config's ``categories``)."""
    return [rule for category in categories for rule in category.to_json()]


def category_of(message: str, trace: str = "", status: str = FAILED,
                categories: tuple[Category, ...] = CATEGORIES) -> str | None:
    """The category Allure files a result under, or None (Allure's own defaults take it)."""
    return next((c.name for c in categories if c.matches(message, trace, status)), None)


def write_categories(results_dir: Path) -> Path:
    path = results_dir / CATEGORIES_FILE
    atomic_write_bytes(path, (json.dumps(categories_json(), indent=2, ensure_ascii=False)
                              + "\n").encode())
    return path


# --- environment.properties ----------------------------------------------------------------

_CONTROL = {"\t": "\\t", "\n": "\\n", "\r": "\\r", "\f": "\\f"}


def escape_property(text: str, *, key: bool) -> str:
    """``text`` as ``java.util.Properties.store`` writes it (a key, or a value).

    Backslash, the separators ``=`` and ``:`` and the comment starters ``#`` and ``!``
    are escaped, as are tabs and line breaks; spaces in a key and a value's leading space
    (the parser would take them as the separator, or skip them); anything outside
    printable ASCII becomes ``\\uXXXX`` (UTF-16 units, so the file stays ASCII).
    """
    out = []
    for index, char in enumerate(text):
        if char in _CONTROL:
            out.append(_CONTROL[char])
        elif char in "\\=:#!":
            out.append("\\" + char)
        elif char == " " and (key or index == 0):
            out.append("\\ ")
        elif " " <= char <= "~":
            out.append(char)
        else:
            encoded = char.encode("utf-16-be")
            out.extend(f"\\u{int.from_bytes(encoded[i:i + 2], 'big'):04X}"
                       for i in range(0, len(encoded), 2))
    return "".join(out)


def environment_properties(properties: Mapping[str, str]) -> str:
    """The file's text: one ``key=value`` line per property, sorted by key."""
    return "".join(f"{escape_property(k, key=True)}={escape_property(v, key=False)}\n"
                   for k, v in sorted(properties.items()))


def write_environment(results_dir: Path, properties: Mapping[str, str]) -> Path:
    path = results_dir / ENVIRONMENT_FILE
    atomic_write_bytes(path, environment_properties(properties).encode("ascii"))
    return path
