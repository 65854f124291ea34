"""The Allure history across the move of the suites: old points keep counting (pure).

Allure 3 keys each test of a history point by ``<case>.<params>``: ``<case>`` is the md5
of allure-pytest's ``testCaseId``, itself the md5 of the test's ``fullName``
(``calculateTestId``/``calculateHistoryId`` in Allure's ``core/store/convert``;
``testCaseId = md5(full_name)`` in allure-pytest's listener), and ``fullName`` is the
node id's module path. The suites' node ids lost their ``harness/`` prefix
(harness/results/test_ids.py), so ``harness.suites.test_x#t`` became ``suites.test_x#t``
and every suite test would start a fresh trend. A history point written before the move
is rewritten to the keys the same tests have now; the parameter half of each key does not
depend on the name and stays as it is.
"""

from __future__ import annotations

import hashlib
from typing import Any

from harness.results.test_ids import current_test_id

#: How a suite test's Allure ``fullName`` began before the move, and begins now.
LEGACY_FULL_NAME_PREFIX = "harness.suites."
FULL_NAME_PREFIX = "suites."


def _md5(text: str) -> str:
    return hashlib.md5(text.encode("utf-8"), usedforsecurity=False).hexdigest()


def case_id(full_name: str) -> str:
    """The first half of Allure 3's history key for a test called ``full_name``."""
    return _md5(_md5(full_name))


def migrate_history_point(point: dict[str, Any]) -> dict[str, Any]:
    """``point`` (one line of the history file) with pre-move suite tests renamed.

    A test whose key does not start with the case id of its own old name (a result
    with an explicit Allure id, say) is left as it is: nothing here guesses.
    """
    results = point.get("testResults")
    if not isinstance(results, dict):
        return point
    renamed_cases: dict[str, str] = {}
    moved: dict[str, Any] = {}
    for key, result in results.items():
        full_name = result.get("fullName") if isinstance(result, dict) else None
        if not (isinstance(full_name, str) and full_name.startswith(LEGACY_FULL_NAME_PREFIX)):
            moved[key] = result
            continue
        old_case = case_id(full_name)
        if not (isinstance(key, str) and key.startswith(old_case + ".")):
            moved[key] = result
            continue
        new_name = FULL_NAME_PREFIX + full_name.removeprefix(LEGACY_FULL_NAME_PREFIX)
        new_case = case_id(new_name)
        renamed_cases[old_case] = new_case
        new_key = new_case + key.removeprefix(old_case)
        moved[new_key] = {**result, "fullName": new_name, "historyId": new_key,
                          "labels": [_label(label) for label in result.get("labels", [])]}
    if not renamed_cases:
        return point
    known = point.get("knownTestCaseIds")
    updated = {**point, "testResults": moved}
    if isinstance(known, list):
        updated["knownTestCaseIds"] = [renamed_cases.get(k, k) if isinstance(k, str) else k
                                       for k in known]
    return updated


def _label(label: Any) -> Any:
    if not isinstance(label, dict) or not isinstance(label.get("value"), str):
        return label
    value: str = label["value"]
    if label.get("name") == "nodeid":
        return {**label, "value": current_test_id(value)}
    if label.get("name") == "package" and value.startswith(LEGACY_FULL_NAME_PREFIX):
        return {**label, "value": FULL_NAME_PREFIX + value.removeprefix(LEGACY_FULL_NAME_PREFIX)}
    return label
