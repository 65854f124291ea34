"""The run-level files of an allure-results folder: environment and failure categories (pure).

The plugin writes both at session end. ``environment.properties`` is read by Allure's
own Java-properties parser, so keys and values are escaped the way
``java.util.Properties.store`` escapes them.

The categories sort failures by cause, and the causes are the harness's own enums, not a
second reading of llama.cpp's log: one category per ``FailureClass``
(harness/verdicts/failure.py decides the class of a failed start, and the supervisor's
error names it in its first line) and one per failing ``GpuState``
(harness/verdicts/gpu_use.py; the verdict's reason names the state). Each category's
name follows from the member's value and its message regex is the pattern the deciding
module keeps beside the words it writes, so a new member is a new category with nothing
to edit here. The rest match the harness's own messages: its build errors, the
infrastructure a run stands on, the plan check and known flakes.

``category_of`` applies the rules in Python exactly as Allure 3 does
(``@allurereport/core-api`` ``matchCategory``): rules in order, the first that matches
wins, a regex matches anywhere in the text (JavaScript ``RegExp.test``, Python
``re.search``), and a rule with both a message and a trace regex needs both. Allure 3
files whatever no rule takes under its own "Product errors" (failed) and "Test errors"
(broken). The regexes stay in the syntax both engines read alike: no inline flags, no
named groups, no lookbehind.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.errors import (
    BuildError,
    ServerNotReadyError,
    ServerStuckError,
    SourceError,
    SourceHashMismatchError,
    ToolMissingError,
)
from harness.facts.build import Backend
from harness.files import atomic_write_bytes
from harness.verdicts.failure import FailureClass, start_failed_pattern
from harness.verdicts.gpu_use import FAILING_STATES, GpuState, failed_reason_pattern
from harness.verdicts.refused_flag import REFUSED_FLAG_PATTERN

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


def _raised(*errors: type[BaseException]) -> str:
    # allure-pytest prefixes the message with the exception's (qualified) class name.
    return r"\b(?:" + "|".join(error.__name__ for error in errors) + r")\b"


def start_failure_category(kind: FailureClass) -> Category:
    """Launches that never served, their last start failing as ``kind``."""
    return Category(f"Start failure: {kind.value}",
                    (Matcher(message_regex=start_failed_pattern(kind)),))


def gpu_use_category(state: GpuState) -> Category:
    """Servers whose GPU-use verdict failed on a block in ``state``."""
    return Category(f"GPU use: {state.value}",
                    (Matcher(message_regex=failed_reason_pattern(state)),))


KNOWN_FLAKE = Category("Known flake", (Matcher(
    statuses=(SKIPPED,),
    # harness/plugin/recording/flakes_plugin.py makes a listed failure an xfail whose reason
    # starts "known flake: "; allure-pytest records it as skipped, "XFAIL <reason>".
    message_regex=r"^XFAIL known flake: "),))

BUILD_FAILURE = Category("Build failure", (Matcher(message_regex=_any(
    # harness.errors: the build, its source and its tools.
    _raised(BuildError, SourceError, SourceHashMismatchError, ToolMissingError),
    # harness/plugin/session.py and harness/plugin/hooks.py, when the build or the image under test
    # cannot be had.
    r"no build under test",
    r"no llama-server image for the container runner",
)),))

INFRASTRUCTURE = Category("Infrastructure / timeout", (Matcher(message_regex=_any(
    # harness/runners/readiness.py: "llama-server was not ready after 60s: still ...".
    r"was not ready after \d",
    _raised(ServerNotReadyError),
    # harness/runners/subprocess_runner.py: a server the kernel holds past SIGKILL.
    _raised(ServerStuckError),
    # pytest-timeout: "Timeout (>600.0s) from pytest-timeout."
    r"Timeout \(>[\d.]+s\) from pytest-timeout",
    r"\btimed out\b",
    # harness/probes/docker_engine.py and harness/runners/llama_server_container.py.
    r"no Docker engine answers",
    r"docker could not start a llama-server container",
    # harness/plugin/hooks.py, --harness-require-gpu: the machine lacks the device the run needs.
    r"this run requires (?:" + "|".join(b.value for b in Backend) + "): ",
)),))


def _suite_assertion(suite_file: str) -> str:
    # pytest's long report ends each frame with "<path>:<line>: <ExceptionType>"; an
    # AssertionError raised in the suite file itself is that suite's own check failing.
    return re.escape(suite_file) + r":\d+: AssertionError"


#: A flag the launch sent and the server refused (harness/verdicts/refused_flag.py): the
#: capability check let it through, so it is the harness's bug, not the build's failure.
REFUSED_FLAG = Category("Harness bug: a sent flag was refused",
                        (Matcher(message_regex=REFUSED_FLAG_PATTERN),))

#: A build of a release the harness's models cannot place (planning/release_rules.py):
#: what the harness does not know, not what the build did wrong.
NOT_MODELLED_RELEASE = Category("Release not modelled by the harness",
                                (Matcher(message_regex=r"not modelled for release \d+"),))

PLAN_FORWARDING = Category("Plan-forwarding mismatch", (
    Matcher(message_regex=_any(
        # suites/test_plan_forwarding.py and harness/verdicts/plan_check.py Mismatch.
        r"the server does not report the plan",
        r"\S+: planned .+, observed ",
    )),
    Matcher(trace_regex=_suite_assertion("test_plan_forwarding.py")),
))

#: In the order they are tried. Known flakes (skipped results only) share no status with
#: the rest. No build makes everything after it moot. A class or state named by the
#: harness's own words comes before the infrastructure's looser ones ("timed out" can be
#: in a failed start's quoted log); the plan check, last, names neither. A refused flag
#: the launch sent is the harness's bug before it is an ``unknown-flag`` start.
CATEGORIES: tuple[Category, ...] = (
    KNOWN_FLAKE, BUILD_FAILURE, REFUSED_FLAG, NOT_MODELLED_RELEASE,
    *(start_failure_category(kind) for kind in FailureClass),
    *(gpu_use_category(state) for state in FAILING_STATES),
    INFRASTRUCTURE, PLAN_FORWARDING,
)


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
