"""The Allure report: run metadata files, failure categories, and rendering bad input.

Results come from a real allure-pytest run of a tiny suite (written into tmp_path and run
in a subprocess), and the report from the pinned Allure 3 CLI in node_modules.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from allure_commons import utils as allure_utils
from checkout import REPO_ROOT
from click.testing import CliRunner

from harness.commands.report import HISTORY_ENV, default_history_path, report_command
from harness.errors import (
    BuildError,
    ConfigError,
    ServerExitedError,
    ServerNotReadyError,
    ToolMissingError,
)
from harness.planning.launch import LaunchSpec
from harness.planning.release_rules import RULES, NotModelled, Rule
from harness.report import allure_meta
from harness.report.allure import ReportError, generate_report, report_config
from harness.report.allure_cli import ALLURE_ENV, ALLURE_VERSION, allure_command
from harness.report.allure_meta import (
    CATEGORIES,
    categories_json,
    category_of,
    environment_properties,
    escape_property,
    write_categories,
    write_environment,
)
from harness.report.history_ids import case_id, migrate_history_point
from harness.report.offline import external_script_sources
from harness.report.staging import repair_history
from harness.supervise.supervisor import LaunchFailedError
from harness.verdicts.failure import FailureClass, StartFailure, classify_start_failure
from harness.verdicts.gpu_use import (
    FAILING_STATES,
    BlockGpuUse,
    GpuState,
    failed_reason,
    gpu_verdict,
)
from harness.verdicts.log_blocks import BlockRole
from harness.verdicts.plan_check import Mismatch
from harness.verdicts.refused_flag import refusal_verdict

#: The tiny suite (tests/data/allure/tiny_suite/README.md), copied in as test_<name>.py.
TINY_SUITE = Path(__file__).parent / "data" / "allure" / "tiny_suite"
#: suite label -> test names, and the counts of the first run.
TINY_SUITES = {"test_alpha": {"test_one", "test_two", "test_plan_mismatch"},
               "test_beta": {"test_three", "test_skipped"}}
FIRST_RUN = {"total": 5, "passed": 3, "failed": 1, "skipped": 1}


def run_tiny_suite(workdir: Path, results: Path, *, second_run: bool = False) -> Path:
    """Run the tiny suite under allure-pytest; the results land in ``results``."""
    workdir.mkdir(parents=True, exist_ok=True)
    for name in ("alpha", "beta"):
        (workdir / f"test_{name}.py").write_text((TINY_SUITE / f"tiny_{name}.py").read_text())
    env = {**os.environ, "TINY_SECOND_RUN": "1" if second_run else "0"}
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "test_alpha.py", "test_beta.py", "--alluredir",
         str(results), "-p", "no:cacheprovider", "-p", "no:xdist", "-p", "no:randomly",
         "-o", "addopts=", "-q"],
        cwd=workdir, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 1, proc.stdout + proc.stderr  # 1: some tests failed
    return results


@pytest.fixture(scope="module")
def tiny_results(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("tiny")
    return run_tiny_suite(work / "suite", work / "allure-results")


def _copy_results(source: Path, target: Path) -> Path:
    target.mkdir(parents=True)
    for path in source.iterdir():
        (target / path.name).write_bytes(path.read_bytes())
    return target


def _report_tests(output: Path) -> dict[str, dict[str, Any]]:
    """The tests in a rendered report's data, by name."""
    tests = [json.loads(p.read_text()) for p in (output / "data" / "test-results").glob("*.json")]
    return {t["name"]: t for t in tests}


# --- environment.properties ----------------------------------------------------------------


@pytest.mark.parametrize(("text", "as_key", "as_value"), [
    ("plain", "plain", "plain"),
    ("a=b:c", "a\\=b\\:c", "a\\=b\\:c"),
    ("C:\\llama\\bin", "C\\:\\\\llama\\\\bin", "C\\:\\\\llama\\\\bin"),
    ("two\nlines\r\n", "two\\nlines\\r\\n", "two\\nlines\\r\\n"),
    ("tab\there", "tab\\there", "tab\\there"),
    (" lead and inner", "\\ lead\\ and\\ inner", "\\ lead and inner"),
    ("#!", "\\#\\!", "\\#\\!"),
    ("RTX™ 4090", "RTX\\u2122\\ 4090", "RTX\\u2122 4090"),
    ("🦙", "\\uD83E\\uDD99", "\\uD83E\\uDD99"),
])
def test_property_escaping(text: str, as_key: str, as_value: str) -> None:
    assert escape_property(text, key=True) == as_key
    assert escape_property(text, key=False) == as_value


def test_environment_file_is_sorted_ascii(tmp_path: Path) -> None:
    path = write_environment(tmp_path, {"z.last": "1", "build": "cuda=on", "a key": "x\ny"})
    assert path == tmp_path / "environment.properties"
    assert path.read_bytes() == b"a\\ key=x\\ny\nbuild=cuda\\=on\nz.last=1\n"
    assert environment_properties({}) == ""


# --- categories ----------------------------------------------------------------------------

#: The categories in their order: one per failure class and per failing GPU state, named
#: after the member, between the harness's own.
EXPECTED_NAMES = ["Known flake", "Build failure", "Harness bug: a sent flag was refused",
                  "Release not modelled by the harness",
                  *(f"Start failure: {kind.value}" for kind in FailureClass),
                  *(f"GPU use: {state.value}" for state in FAILING_STATES),
                  "Infrastructure / timeout", "Plan-forwarding mismatch"]


def test_categories_json_shape(tmp_path: Path) -> None:
    rules = json.loads(write_categories(tmp_path).read_text())
    assert rules == categories_json()
    assert list(dict.fromkeys(r["name"] for r in rules)) == EXPECTED_NAMES
    for rule in rules:
        assert set(rule) <= {"name", "matchedStatuses", "messageRegex", "traceRegex"}
        assert set(rule["matchedStatuses"]) <= {"failed", "broken", "skipped"}
        assert "messageRegex" in rule or "traceRegex" in rule
        for key in ("messageRegex", "traceRegex"):
            if key in rule:
                re.compile(rule[key])
                # Allure compiles them as JavaScript RegExps: no Python-only syntax.
                assert "(?P" not in rule[key]
                assert not re.search(r"\(\?[aiLmsux]", rule[key])
    # Rules of one category are adjacent, so Allure's merge by name keeps this order.
    names = [r["name"] for r in rules]
    assert names == sorted(names, key=EXPECTED_NAMES.index)


def _message(exc: BaseException) -> str:
    """The message allure-pytest records for ``exc`` (its own formatter)."""
    formatter: Any = allure_utils.format_exception  # allure ships no type hints
    return str(formatter(type(exc), exc))


def _launch_failed(failure: StartFailure) -> str:
    return _message(LaunchFailedError(failure, (), f"{failure.kind.value} is not a failure a "
                                                   "retry can fix"))


def _gpu_failed(state: GpuState, role: BlockRole = BlockRole.TARGET) -> str:
    block = BlockGpuUse(role, state, None, None, None, (), None, False, (), "why, in words")
    return _message(AssertionError(failed_reason(block)))


@pytest.mark.parametrize("kind", list(FailureClass))
def test_each_failure_class_is_a_category(kind: FailureClass) -> None:
    """A new FailureClass member is a category of its own, named after its value."""
    failure = StartFailure(kind, "the log line that decided it", 1)
    assert category_of(_launch_failed(failure), "", "broken") == f"Start failure: {kind.value}"
    assert f"Start failure: {kind.value}" in {r["name"] for r in categories_json()}


@pytest.mark.parametrize("state", FAILING_STATES)
@pytest.mark.parametrize("role", list(BlockRole))
def test_each_failing_gpu_state_is_a_category(state: GpuState, role: BlockRole) -> None:
    assert category_of(_gpu_failed(state, role)) == f"GPU use: {state.value}"


def test_passing_gpu_states_are_no_category() -> None:
    assert set(FAILING_STATES) == set(GpuState) - {GpuState.USED, GpuState.NO_GPU_EXPECTED}
    assert category_of(_gpu_failed(GpuState.USED)) is None


def test_allure_meta_lists_no_member_of_the_enums() -> None:
    """The categories follow from the enums: allure_meta names no member, so a new one
    needs no edit there."""
    tree = ast.parse(Path(allure_meta.__file__).read_text(encoding="utf-8"))
    named = [f"{node.value.id}.{node.attr}" for node in ast.walk(tree)
             if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
             and node.value.id in {"FailureClass", "GpuState"}]
    assert named == []


@pytest.mark.parametrize("log", [
    "E llama_model_load: unable to allocate CUDA0 buffer\n",
    "E srv load_model: failed to load draft model, '/cache/drafter.gguf'\n",
    "error: invalid argument: --no-such-flag\n",
    "ggml_cuda_init: failed to initialize CUDA: no CUDA-capable device is detected\n",
])
def test_one_classifier_decides(log: str) -> None:
    """llama.cpp's own words file nothing; the class the supervisor named does."""
    exited = ServerExitedError(f"llama-server exited with exit code 1 before it was ready\n"
                               f"--- last 1 log lines ---\n{log}---")
    assert category_of(_message(exited), "", "broken") is None
    failure = classify_start_failure(1, log, timed_out=False)
    assert category_of(_launch_failed(failure), "", "broken") == (
        f"Start failure: {failure.kind.value}")


_CPU_LOG = ("system_info: n_threads = 4 (n_threads_batch = 4) / 4 | CPU : SSE3 = 1 | AVX = 1 |\n"
            "load_tensors:   CPU_Mapped model buffer size =    10.00 MiB\n")
_DRAFT = classify_start_failure(1, "E srv load_model: failed to load draft model, "
                                   "'/cache/drafter.gguf'\n", timed_out=False)
_OOM = classify_start_failure(1, "E llama_model_load: unable to allocate CUDA0 buffer\n"
                                 "E llama_model_load_from_file_impl: failed to load model\n",
                              timed_out=False)
_TIMEOUT = StartFailure(FailureClass.READINESS_TIMEOUT, "I srv load_model: loading model")
_REFUSED = classify_start_failure(1, "error: invalid argument: --n-cpu-ffn\n", timed_out=False)
_PLAN = AssertionError("the server does not report the plan:\n"
                       + str(Mismatch("ctx_size", 1024, 512)) + "\nassert not ['ctx_size: …']")
_ASSERTION_TRACE = "    assert _moved(launch.server) == planned_names\n\n{}:182: AssertionError"

#: (id, message, trace, status, expected category), messages from the harness's own code.
REAL_MESSAGES: list[tuple[str, str, str, str, str | None]] = [
    ("build-error", _message(BuildError(
        "`cmake --build /cache/build/cpu` failed with exit code 2.\n--- last 40 lines of "
        "the build log ---\nninja: build stopped: subcommand failed.")), "", "broken",
     "Build failure"),
    ("image-build", _message(BuildError("the cuda image build failed: exit 1")), "", "failed",
     "Build failure"),
    ("not-ready", _message(ServerNotReadyError(
        "llama-server was not ready after 60s: still waiting for /health answered 503 "
        "loading model")), "", "broken", "Infrastructure / timeout"),
    ("launch-timeout", _launch_failed(_TIMEOUT), "", "broken",
     "Start failure: readiness-timeout"),
    ("pytest-timeout", "Failed: Timeout (>600.0s) from pytest-timeout.", "", "failed",
     "Infrastructure / timeout"),
    ("no-docker", _message(ConfigError(
        "no Docker engine answers (Error while fetching server API version); start one")),
     "", "broken", "Infrastructure / timeout"),
    ("drafter-load", _message(LaunchFailedError(
        _DRAFT, (), "the server reported drafter-load, but this launch has no drafter or spec "
        "type to leave out")), "", "broken", "Start failure: drafter-load"),
    # A suite's check on the classes names two of them: the suite's own failure, no start's.
    ("drafter-assert", "AssertionError: assert <FailureClass.OUT_OF_MEMORY: 'out-of-memory'> "
     "is <FailureClass.DRAFTER_LOAD: 'drafter-load'>", "", "failed", None),
    # The supervisor's reason for a flag the launch itself sent: the harness's bug.
    ("refused-planned-flag", _message(LaunchFailedError(
        _REFUSED, (), "unknown-flag is not a failure a retry can fix; " + str(refusal_verdict(
            _REFUSED, LaunchSpec(model=Path("m.gguf"), n_cpu_ffn=1))))), "", "broken",
     "Harness bug: a sent flag was refused"),
    ("oom", _message(LaunchFailedError(
        _OOM, (), "out of memory on every rung of the offload ladder (tried: 1. all layers on "
        "the GPU); the context is at its floor")), "", "broken", "Start failure: out-of-memory"),
    # Earlier attempts' classes are listed below the headline; the last start's decides.
    ("oom-after-drafter", _message(LaunchFailedError(_OOM, (), "no rung left"))
     + f"\n  attempt 1 (all layers on the GPU): {_DRAFT}", "", "broken",
     "Start failure: out-of-memory"),
    ("offload-suite", "AssertionError: assert {'blk.0.ffn_up_exps.weight'} == set()",
     _ASSERTION_TRACE.format("suites/test_offload_ladders.py"), "failed", None),
    ("gpu-not-loaded", _message(AssertionError(gpu_verdict(_CPU_LOG, "cuda").reason)), "",
     "failed", "GPU use: not-loaded"),
    ("gpu-no-devices", _message(AssertionError(
        gpu_verdict("ggml_vulkan: No devices found.\n" + _CPU_LOG, "vulkan").reason)), "",
     "failed", "GPU use: no-devices"),
    ("require-gpu", "Failed: this run requires cuda: /opt/llama-server --list-devices shows "
     "no cuda device", "", "failed", "Infrastructure / timeout"),
    # suites/test_plan_forwarding.py's finding for a release between a rule's two ends.
    ("not-modelled", "Failed: " + str(NotModelled(RULES[Rule.MTP_KV_EVERY_ARCH], 10905))
     + "; observed: kv cache 512 cells x 3 layers", "", "failed",
     "Release not modelled by the harness"),
    ("plan", _message(_PLAN), "", "failed", "Plan-forwarding mismatch"),
    ("plan-suite", "AssertionError: assert 'rtx-4090' == 'rtx-3090'",
     _ASSERTION_TRACE.format("suites/test_plan_forwarding.py"), "failed",
     "Plan-forwarding mismatch"),
    ("other", "AssertionError: assert 1 == 2", "test_x.py:3: AssertionError", "failed", None),
    ("skipped", _message(BuildError("boom")), "", "skipped", None),
    # harness/plugin/recording/flakes_plugin.py's reason, as allure-pytest records an xfail.
    ("known-flake", "XFAIL known flake: races the slot reset (https://issues.example.org/1)"
     "\n\nAssertionError: assert 'a' == 'b'", "", "skipped", "Known flake"),
    ("failed-naming-a-flake", "AssertionError: known flake: no", "", "failed", None),
    # Every class and every failing state, as the harness's own messages name them.
    *((f"start-{kind.value}", _launch_failed(StartFailure(kind, "evidence", 1)), "",
       "broken", f"Start failure: {kind.value}") for kind in FailureClass),
    *((f"gpu-state-{state.value}", _gpu_failed(state), "", "failed", f"GPU use: {state.value}")
      for state in FAILING_STATES),
]


@pytest.mark.parametrize(("message", "trace", "status", "expected"),
                         [pytest.param(*row[1:], id=row[0]) for row in REAL_MESSAGES])
def test_category_of_real_messages(message: str, trace: str, status: str,
                                   expected: str | None) -> None:
    assert category_of(message, trace, status) == expected


def _synthetic_result(directory: Path, name: str, message: str, trace: str,
                      status: str) -> None:
    test_id = uuid.uuid4().hex
    result = {"uuid": test_id, "historyId": test_id, "testCaseId": test_id, "name": name,
              "fullName": f"categories#{name}", "status": status, "stage": "finished",
              "statusDetails": {"message": message, "trace": trace}, "start": 1, "stop": 2,
              "labels": [{"name": "suite", "value": "categories"}]}
    (directory / f"{test_id}-result.json").write_text(json.dumps(result))


def test_allure_files_real_messages_where_category_of_does(tmp_path: Path) -> None:
    """Allure's own (JavaScript) matching agrees with ``category_of`` on every message."""
    results = tmp_path / "results"
    results.mkdir()
    for row_id, message, trace, status, _ in REAL_MESSAGES:
        _synthetic_result(results, row_id, message, trace, status)
    report = generate_report(results, tmp_path / "report")
    assert report.problems == ()
    tree = json.loads((report.output_dir / "widgets" / "categories.json").read_text())
    nodes = tree["nodes"]
    filed: dict[str, str] = {}

    def walk(node_id: str, category: str) -> None:
        node = nodes[node_id]
        if node["type"] == "tr":
            filed[node["name"]] = category
        for child in node.get("childrenIds", []):
            walk(child, category)

    for root in tree["roots"]:
        walk(root, nodes[root]["name"])
    for row_id, message, trace, status, expected in REAL_MESSAGES:
        # What no rule takes, Allure files under its defaults (or, if skipped, nowhere).
        defaults = {"failed": "Product errors", "broken": "Test errors"}
        wanted = expected or defaults.get(status)
        assert filed.get(row_id) == wanted, (row_id, message)
        assert category_of(message, trace, status) == expected


# --- rendering -----------------------------------------------------------------------------


def test_report_of_a_real_run(tiny_results: Path, tmp_path: Path) -> None:
    results = _copy_results(tiny_results, tmp_path / "results")
    write_environment(results, {"build": "cpu=b1234", "gpu": "none: CPU only"})
    write_categories(results)
    history = tmp_path / "history" / "allure-history.jsonl"
    report = generate_report(results, tmp_path / "report", history_path=history)
    assert report.problems == ()
    assert report.tests == FIRST_RUN["total"]
    assert report.index_html == tmp_path / "report" / "index.html"
    assert report.index_html.is_file()
    # Allure writes an analytics loader into every page; the harness takes it out.
    page = report.index_html.read_text()
    assert external_script_sources(page) == []
    assert "gtag(" not in page
    summary = json.loads((report.output_dir / "summary.json").read_text())
    assert {k: summary["stats"].get(k) for k in FIRST_RUN} == FIRST_RUN
    tests = _report_tests(report.output_dir)
    assert set(tests) == set().union(*TINY_SUITES.values())
    assert [c["name"] for c in tests["test_plan_mismatch"]["categories"]] == [
        "Plan-forwarding mismatch"]
    # Allure's own properties parser reads back what write_environment escaped.
    environment = json.loads(
        (report.output_dir / "widgets" / "allure_environment.json").read_text())
    assert {e["name"]: e["values"] for e in environment} == {
        "build": ["cpu=b1234"], "gpu": ["none: CPU only"]}
    assert len(history.read_text().splitlines()) == 1


def test_corrupt_results_name_the_bad_files_and_render_the_rest(tiny_results: Path,
                                                                 tmp_path: Path) -> None:
    results = _copy_results(tiny_results, tmp_path / "results")
    good = sorted(results.glob("*-result.json"))
    truncated = results / "0badc0de-0000-4000-8000-000000000001-result.json"
    truncated.write_bytes(good[0].read_bytes()[:70])
    not_object = results / "0badc0de-0000-4000-8000-000000000002-result.json"
    not_object.write_text('["a", "list"]')
    dangling = results / "0badc0de-0000-4000-8000-000000000003-result.json"
    dangling.symlink_to(tmp_path / "gone")
    binary = results / "0badc0de-0000-4000-8000-000000000004-container.json"
    binary.write_bytes(b"\xff\xfe\x00")
    # A good result that names an attachment whose file is gone: kept, and named.
    with_attachment = next(p for p in good
                           if json.loads(p.read_text())["name"] == "test_one")
    document = json.loads(with_attachment.read_text())
    document["attachments"] = [{"name": "server log", "source": "missing-attachment.txt",
                                "type": "text/plain"}]
    with_attachment.write_text(json.dumps(document))
    history = tmp_path / "allure-history.jsonl"
    history.write_text('{"uuid": "earlier", "timestamp": 1, "testResults": {}}\n{"uuid": "tr')

    report = generate_report(results, tmp_path / "report", history_path=history)

    problems = "\n".join(report.problems)
    assert f"{truncated}: not valid JSON (truncated?)" in problems
    assert f"{not_object}: a JSON list, not an object" in problems
    assert f"{dangling}: unreadable" in problems
    assert f"{binary}: not UTF-8 text" in problems
    assert (f"{with_attachment}: attachment 'missing-attachment.txt' ('server log') is "
            "missing") in problems
    assert f"{history} line 2: not valid JSON (truncated?)" in problems
    assert len(report.problems) == 6
    assert report.index_html.is_file()
    assert report.tests == FIRST_RUN["total"]
    tests = _report_tests(report.output_dir)
    assert tests["test_one"]["status"] == "passed"
    assert set(tests) == set().union(*TINY_SUITES.values())
    # The bad history line is gone, and this run was added after the good one.
    lines = history.read_text().splitlines()
    assert len(lines) == 2
    assert json.loads(lines[0])["uuid"] == "earlier"


def test_missing_or_empty_results_are_clear_errors(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere"
    with pytest.raises(ReportError, match=r"nowhere does not exist; run the suites with "
                                          r"`--alluredir .*nowhere`"):
        generate_report(missing, tmp_path / "report")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ReportError, match=r"holds no \*-result\.json file"):
        generate_report(tmp_path / "empty", tmp_path / "report")
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "x-result.json").write_text("{")
    with pytest.raises(ReportError, match=r"no readable test result in .*\n  .*x-result.json: "
                                          r"not valid JSON"):
        generate_report(bad, tmp_path / "report")
    assert not (tmp_path / "report").exists()


def test_output_that_is_not_a_report_is_left_alone(tiny_results: Path, tmp_path: Path) -> None:
    output = tmp_path / "docs"
    output.mkdir()
    (output / "notes.txt").write_text("mine")
    with pytest.raises(ReportError, match="is not an Allure report"):
        generate_report(tiny_results, output)
    assert (output / "notes.txt").read_text() == "mine"


def test_allure_failure_shows_its_output(tiny_results: Path, tmp_path: Path) -> None:
    results = _copy_results(tiny_results, tmp_path / "results")
    # Named rules pass the harness's check; Allure itself rejects mixed matcher keys.
    (results / "categories.json").write_text(json.dumps(
        [{"name": "mixed", "matchers": {"statuses": ["failed"]}, "messageRegex": "x"}]))
    with pytest.raises(ReportError, match=r"(?s)Allure failed with exit code 1.*mixes "
                                          r"canonical keys with compatibility keys"):
        generate_report(results, tmp_path / "report")
    assert not (tmp_path / "report").exists()


def _fake_allure(root: Path, version: str = ALLURE_VERSION) -> Path:
    """An npm-style install under ``root``: the package and its ``.bin`` link."""
    package = root / "node_modules" / "allure"
    package.mkdir(parents=True)
    (package / "package.json").write_text(json.dumps({"name": "allure", "version": version}))
    (package / "cli.js").write_text("#!/usr/bin/env node\n")
    (package / "cli.js").chmod(0o755)
    link = root / "node_modules" / ".bin" / "allure"
    link.parent.mkdir()
    link.symlink_to("../allure/cli.js")
    return package / "cli.js"


@pytest.fixture
def node_only_path(tmp_path: Path) -> str:
    """A PATH on which there is node and nothing else."""
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed (apt-get install nodejs)")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "node").symlink_to(node)
    return str(bin_dir)


def test_the_cli_is_found_in_node_modules_of_the_working_directory_or_above(
        tmp_path: Path, node_only_path: str) -> None:
    cli = _fake_allure(tmp_path / "project")
    deep = tmp_path / "project" / "a" / "b"
    deep.mkdir(parents=True)
    command = allure_command({"PATH": node_only_path}, deep)
    assert command == [str(Path(node_only_path) / "node"), str(cli.resolve())]


def test_harness_allure_comes_first_and_a_wrong_one_is_named(
        tmp_path: Path, node_only_path: str) -> None:
    _fake_allure(tmp_path / "project")
    chosen = _fake_allure(tmp_path / "elsewhere")
    env = {"PATH": node_only_path, ALLURE_ENV: str(chosen)}
    assert allure_command(env, tmp_path / "project")[-1] == str(chosen.resolve())
    env[ALLURE_ENV] = str(tmp_path / "nothing-here")
    with pytest.raises(ToolMissingError, match=rf"{ALLURE_ENV}=.*nothing-here: no such file"):
        allure_command(env, tmp_path / "project")


def test_the_cli_on_path_is_used_when_no_node_modules_has_one(
        tmp_path: Path, node_only_path: str) -> None:
    cli = _fake_allure(tmp_path / "global")
    (Path(node_only_path) / "allure").symlink_to(cli)
    assert allure_command({"PATH": node_only_path}, tmp_path)[-1] == str(cli.resolve())


def test_a_missing_cli_names_the_install_command_and_the_setting(
        tmp_path: Path, node_only_path: str) -> None:
    with pytest.raises(ToolMissingError) as caught:
        allure_command({"PATH": node_only_path}, tmp_path)
    message = str(caught.value)
    assert "the Allure report CLI is not installed" in message
    assert f"npm install allure@{ALLURE_VERSION}" in message
    assert f"set {ALLURE_ENV}" in message
    assert "bash scripts/setup.sh" in message


def test_another_allure_version_is_refused(tmp_path: Path, node_only_path: str) -> None:
    _fake_allure(tmp_path, version="3.0.0")
    with pytest.raises(ToolMissingError, match=re.escape(
            f"is allure 3.0.0, but the harness is made for allure {ALLURE_VERSION}")):
        allure_command({"PATH": node_only_path}, tmp_path)


def test_without_node_the_message_says_to_install_it(tmp_path: Path) -> None:
    with pytest.raises(ToolMissingError, match="node is not installed"):
        allure_command({"PATH": str(tmp_path / "no-bin")}, tmp_path)


def test_package_json_and_its_lock_pin_the_release_the_harness_is_made_for() -> None:
    manifest = json.loads((REPO_ROOT / "package.json").read_text())
    lock = json.loads((REPO_ROOT / "package-lock.json").read_text())
    assert manifest["dependencies"]["allure"] == ALLURE_VERSION
    assert lock["packages"]["node_modules/allure"]["version"] == ALLURE_VERSION


def test_config_single_file_and_history(tmp_path: Path) -> None:
    config = report_config(tmp_path / "out", report_name="r", single_file=True,
                           history_path=tmp_path / "h.jsonl")
    assert config["plugins"]["awesome"]["options"]["singleFile"] is True
    assert config["historyPath"] == str(tmp_path / "h.jsonl")
    assert config["categories"] == categories_json()
    assert "historyPath" not in report_config(tmp_path, report_name="r", single_file=False,
                                              history_path=None)


def test_repair_history(tmp_path: Path) -> None:
    history = tmp_path / "h.jsonl"
    assert repair_history(history) == ()
    history.write_text('{"a": 1}\n[1]\n\n{"b": 2}')
    assert repair_history(history) == (f"{history} line 2: a JSON list, not an object; the "
                                       "line was dropped",)
    assert history.read_text() == '{"a": 1}\n{"b": 2}\n'
    assert repair_history(history) == ()


def test_report_command(tiny_results: Path, tmp_path: Path) -> None:
    results = _copy_results(tiny_results, tmp_path / "results")
    (results / "broken-result.json").write_text("{")
    history = tmp_path / "h.jsonl"
    outcome = CliRunner().invoke(report_command, [
        "--results", str(results), "--output", str(tmp_path / "out"), "--history",
        str(history), "--single-file"])
    assert outcome.exit_code == 0, outcome.output
    assert outcome.stdout.splitlines()[-1] == str(tmp_path / "out" / "index.html")
    assert f"warning: {results / 'broken-result.json'}: not valid JSON" in outcome.stderr
    assert {p.name for p in (tmp_path / "out").iterdir()} >= {"index.html"}
    assert not (tmp_path / "out" / "data").exists()  # single file: no data folder
    assert len(history.read_text().splitlines()) == 1


def test_default_history_path(tmp_path: Path) -> None:
    assert default_history_path({HISTORY_ENV: str(tmp_path / "h.jsonl")}) == tmp_path / "h.jsonl"
    assert default_history_path({"HARNESS_CACHE": str(tmp_path)}) == \
        tmp_path / "allure-history.jsonl"


def test_every_category_is_exercised() -> None:
    assert {row[4] for row in REAL_MESSAGES} - {None} == {c.name for c in CATEGORIES}


# --- the history across the move of the suites ---------------------------------------------


def _suite_result(directory: Path, full_name: str, nodeid: str, fixture: str) -> None:
    """A result as allure-pytest writes it for a parametrized suite test."""
    test_id = uuid.uuid4().hex
    case = hashlib.md5(full_name.encode(), usedforsecurity=False).hexdigest()
    result = {"uuid": test_id, "historyId": test_id, "testCaseId": case,
              "name": f"test_serves[{fixture}]", "fullName": full_name, "status": "passed",
              "stage": "finished", "start": 1, "stop": 2,
              "parameters": [{"name": "fixture", "value": f"'{fixture}'"}],
              "labels": [{"name": "nodeid", "value": f"{nodeid}::test_serves[{fixture}]"},
                         {"name": "package", "value": full_name.split("#", maxsplit=1)[0]}]}
    (directory / f"{test_id}-result.json").write_text(json.dumps(result))


def _history_keys(history: Path) -> list[set[str]]:
    return [set(json.loads(line)["testResults"]) for line in history.read_text().splitlines()]


def test_a_history_written_before_the_suites_moved_continues(tmp_path: Path) -> None:
    """Real Allure, twice: a run named the old way (``harness.suites…``), then the same
    tests named the new way; the old point is rewritten, so both points key the same
    tests alike and the trend goes on."""
    history = tmp_path / "history.jsonl"
    before, after = tmp_path / "before", tmp_path / "after"
    for folder, full_name, nodeid in (
            (before, "harness.suites.test_smoke#test_serves", "harness/suites/test_smoke.py"),
            (after, "suites.test_smoke#test_serves", "suites/test_smoke.py")):
        folder.mkdir()
        for fixture in ("dense", "moe"):
            _suite_result(folder, full_name, nodeid, fixture)
    generate_report(before, tmp_path / "report-before", history_path=history)
    (old_keys,) = _history_keys(history)
    generate_report(after, tmp_path / "report-after", history_path=history)
    migrated, new = _history_keys(history)
    assert len(new) == 2
    assert migrated == new
    assert not old_keys & new, "the two namings key the tests apart without the migration"
    point = json.loads(history.read_text().splitlines()[0])
    assert {r["fullName"] for r in point["testResults"].values()} == {
        "suites.test_smoke#test_serves"}
    nodeids = {label["value"] for r in point["testResults"].values() for label in r["labels"]
               if label["name"] == "nodeid"}
    assert nodeids == {"suites/test_smoke.py::test_serves[dense]",
                       "suites/test_smoke.py::test_serves[moe]"}


def test_a_history_point_of_other_tests_is_left_as_it_is() -> None:
    point = {"testResults": {"abc.def": {"fullName": "tests.test_x#t", "labels": []}},
             "knownTestCaseIds": ["abc"]}
    assert migrate_history_point(point) is point
    # A key that is not the old name's case id (an explicit Allure id) is not guessed at.
    odd = {"testResults": {"0123.def": {"fullName": "harness.suites.test_x#t"}}}
    assert migrate_history_point(odd) is odd
    case = case_id("harness.suites.test_x#t")
    real = {"testResults": {f"{case}.def": {"fullName": "harness.suites.test_x#t"}},
            "knownTestCaseIds": [case, "other"]}
    moved = migrate_history_point(real)
    assert moved["knownTestCaseIds"] == [case_id("suites.test_x#t"), "other"]
    assert list(moved["testResults"]) == [f"{case_id('suites.test_x#t')}.def"]
