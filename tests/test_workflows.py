"""The CI files in ci/: linted, well-formed, and every command in them exists.

zizmor audits the GitHub workflows. PyYAML reads the workflows and the GitLab file for
what a reviewer would check by eye (timeouts, a concurrency group, artifact retention,
secrets only in ``env:``). Every ``harness …`` command in a ``run:`` block, a GitLab
``script:`` line or ci/scripts/*.sh is parsed by the real click CLI, and every
``--harness-*`` pytest option is looked up in the plugin, so a renamed option breaks
this test instead of a CI run.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast

import click
import pytest
import yaml
from gate_copy import GATE, bare_gate

import harness.plugin.hooks
from harness import modelgen
from harness.commands import cli
from harness.probes.gpu_configs import load_gpu_configs

ROOT = Path(__file__).resolve().parent.parent
WORKFLOW_DIR = ROOT / "ci" / "github" / "workflows"
WORKFLOWS = sorted(WORKFLOW_DIR.glob("*.yml"))
ZIZMOR_CONFIG = ROOT / "ci" / "github" / "zizmor.yml"
GITLAB = ROOT / "ci" / "gitlab" / ".gitlab-ci.yml"
SCRIPTS = sorted((ROOT / "ci" / "scripts").glob("*.sh"))
GPU_BACKENDS = {"cuda", "rocm", "vulkan"}
#: GitLab's top-level keywords; every other top-level key not starting with "." is a job.
GITLAB_KEYWORDS = {"default", "include", "stages", "variables", "workflow", "image",
                   "services", "cache", "before_script", "after_script"}


# -- shell commands ------------------------------------------------------------------

_OPERATOR_CHARS = "();<>|&\n"
#: Words that may stand before a command without being it.
_PREFIX_WORDS = {"if", "then", "else", "elif", "do", "while", "until", "!", "{", "}",
                 "exec", "time", "command"}
_ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\+?=.*", re.DOTALL)
_HEREDOC = re.compile(r"<<-?\s*(['\"]?)(\w+)\1")


def _strip_heredocs(text: str) -> str:
    """The text without here-document bodies (other languages' code, not commands)."""
    kept: list[str] = []
    ending: str | None = None
    for line in text.splitlines():
        if ending is not None:
            if line.strip() == ending:
                ending = None
            continue
        kept.append(line)
        opened = _HEREDOC.search(line)
        if opened:
            ending = opened.group(2)
    return "\n".join(kept)


def _strip_comments(text: str) -> str:
    lines = []
    for line in text.splitlines():
        if line.lstrip().startswith("#"):
            continue
        # A trailing comment: " #" with no quote after it (so "a # b" stays).
        lines.append(re.sub(r"\s#[^'\"]*$", "", line))
    return "\n".join(lines)


def shell_commands(text: str) -> list[list[str]]:
    """The simple commands of a shell text as words: quotes removed, ``$VAR`` kept.

    Line continuations are joined, here-document bodies and comments dropped; the
    text is split at pipes, lists, subshells and command substitutions, so
    ``x=$(harness build … | tail -n 1)`` yields ``harness build …``. Leading
    assignments and keywords (``if``, ``then``, ``exec`` …) are dropped.
    """
    text = _strip_comments(_strip_heredocs(text.replace("\\\n", " ")))
    lexer = shlex.shlex(text, posix=True, punctuation_chars=_OPERATOR_CHARS)
    lexer.whitespace = " \t\r"
    lexer.whitespace_split = True
    lexer.commenters = ""
    commands: list[list[str]] = []
    current: list[str] = []
    for token in lexer:
        if token and all(ch in _OPERATOR_CHARS for ch in token):
            # "2>file": the descriptor number belongs to the redirection, not the command.
            if token[0] in "<>" and current and current[-1].isdigit():
                current.pop()
            commands.append(current)
            current = []
            continue
        current.append(token)
    commands.append(current)
    simple = []
    for words in commands:
        start = 0
        while start < len(words) and (words[start] in _PREFIX_WORDS or words[start] == "$"
                                      or _ASSIGNMENT.fullmatch(words[start])):
            start += 1
        if start < len(words):
            simple.append(words[start:])
    return simple


def harness_commands(text: str) -> list[list[str]]:
    """The argument lists of the ``harness`` commands in a shell text."""
    return [words[1:] for words in shell_commands(text) if words[0] == "harness"]


# -- checking them against the real CLI and plugin -------------------------------------

def _placeholder(param: click.Parameter | None) -> str:
    """A value of the right type for an argument the shell fills in (``"$VAR"``)."""
    kind = param.type if param is not None else click.STRING
    if isinstance(kind, click.Choice):
        return str(kind.choices[0])
    if isinstance(kind, click.IntRange | click.FloatRange):
        low = kind.min if kind.min is not None else 0
        return str(low + 1 if kind.min_open or kind.min is None else low)
    if isinstance(kind, click.types.IntParamType | click.types.FloatParamType):
        return "1"
    if isinstance(kind, click.Path):
        if kind.exists:
            return str(Path(__file__)) if kind.file_okay else str(Path(__file__).parent)
        return "placeholder-path"
    return "placeholder"


_ARRAY_EXPANSION = re.compile(r"\$\{\w+\[@\]\}")


def _fill(command: click.Command, args: list[str]) -> list[str]:
    """``args`` with every word holding a shell variable replaced by a placeholder."""
    options = {name: param for param in command.params if isinstance(param, click.Option)
               for name in [*param.opts, *param.secondary_opts]}
    filled: list[str] = []
    pending: click.Option | None = None
    for word in args:
        if _ARRAY_EXPANSION.fullmatch(word):
            # "${opts[@]}" stands for options whose words are checked where the array
            # is filled (an array literal is a command line of its own to this check).
            pending = None
            continue
        if "$" in word:
            name, equals, _ = word.partition("=")
            if word.startswith("--") and equals:
                filled.append(f"{name}={_placeholder(options.get(name))}")
            else:
                filled.append(_placeholder(pending))
            pending = None
            continue
        filled.append(word)
        option = options.get(word)
        pending = option if option is not None and not option.is_flag else None
    return filled


def parse_harness(args: list[str]) -> None:
    """Parse ``harness ARGS`` with the real CLI; raises click.UsageError when it would.

    ``harness run`` hands the options it does not know to pytest: those must be pytest's.
    """
    command: click.Command = cli
    ctx = cli.make_context("harness", [], resilient_parsing=True)
    name = "harness"
    while isinstance(command, click.Group):
        if not args:
            raise click.UsageError("missing command", ctx)
        name, *args = args
        found = command.get_command(ctx, name)
        if found is None:
            raise click.UsageError(f"No such command {name!r}.", ctx)
        command = found
        if isinstance(command, click.Group):
            ctx = command.make_context(name, [], parent=ctx, resilient_parsing=True)
    with command.make_context(name, _fill(command, args), parent=ctx) as parsed:
        passed_on = parsed.params.get("pytest_args") or ()
    unknown = unknown_pytest_options(list(passed_on))
    if unknown:
        raise click.NoSuchOption(unknown[0], ctx=ctx)


@functools.cache
def pytest_long_options() -> frozenset[str]:
    """Every long option ``pytest --help`` lists here (plugins included)."""
    done = subprocess.run([sys.executable, "-m", "pytest", "--help", "-p", "no:cacheprovider"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120, check=True)
    return frozenset(re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", done.stdout))


def unknown_pytest_options(args: list[str]) -> list[str]:
    """The long options among ``args`` that pytest does not take."""
    return [word.partition("=")[0] for word in args
            if word.startswith("--") and "$" not in word
            and word.partition("=")[0] not in pytest_long_options()]


def _pytest_args(words: list[str]) -> list[str] | None:
    """The arguments of a pytest command (``pytest …``, ``python3 -m pytest …``)."""
    if Path(words[0]).name == "pytest":
        return words[1:]
    if re.fullmatch(r"python3?(\.\d+)?", Path(words[0]).name) and words[1:3] == ["-m", "pytest"]:
        return words[3:]
    return None


class _OptionRecorder:
    """Stands in for pytest's parser and its groups: records each option's choices."""

    def __init__(self) -> None:
        self.options: dict[str, list[str] | None] = {}
        #: The parser of each option that takes a value without a list of choices.
        self.types: dict[str, Callable[[str], object]] = {}

    def getgroup(self, *args: object, **kwargs: object) -> _OptionRecorder:
        return self

    def addoption(self, *names: str, **kwargs: Any) -> None:
        for name in names:
            self.options[name] = list(kwargs["choices"]) if kwargs.get("choices") else None
            if callable(kwargs.get("type")):
                self.types[name] = kwargs["type"]

    def addini(self, *args: object, **kwargs: object) -> None:
        pass


def plugin_options() -> dict[str, list[str] | None]:
    return _recorded_options().options


def _recorded_options() -> _OptionRecorder:
    recorder = _OptionRecorder()
    harness.plugin.hooks.pytest_addoption(cast(pytest.Parser, recorder))
    return recorder


_PLUGIN_OPTION = re.compile(r"(--harness-[A-Za-z0-9-]*[A-Za-z0-9])(?:(=|[ \t]+)(\S+))?")


def check_commands(text: str, where: str) -> list[str]:
    """What is wrong with the harness commands and --harness-* options in ``text``."""
    problems = []
    for args in harness_commands(text):
        try:
            parse_harness(list(args))
        except click.ClickException as exc:
            problems.append(f"{where}: harness {' '.join(args)}: {exc.format_message()}")
    for words in shell_commands(text):
        pytest_args = _pytest_args(words)
        for option in unknown_pytest_options(pytest_args or []):
            problems.append(f"{where}: {option} is not an option of pytest here")
    recorded = _recorded_options()
    known = recorded.options
    for match in _PLUGIN_OPTION.finditer(text):
        option, value = match.group(1), match.group(3)
        if option not in known:
            problems.append(f"{where}: {option} is not an option of the harness plugin")
            continue
        value = value.strip("\"'") if value else None
        choices = known[option]
        if choices and value and "$" not in value and not value.startswith(("-", "\\")) \
                and value not in choices:
            problems.append(f"{where}: {option} {value}: not one of {', '.join(choices)}")
        parse = recorded.types.get(option)
        if parse is not None and value and "$" not in value \
                and not value.startswith(("-", "\\")):
            try:
                parse(value)
            except (argparse.ArgumentTypeError, ValueError) as exc:
                problems.append(f"{where}: {option} {value}: {exc}")
    return problems


# -- reading the CI files ------------------------------------------------------------

def _load(path: Path) -> dict[Any, Any]:
    loaded = yaml.safe_load(path.read_text())
    assert isinstance(loaded, dict), f"{path} is not a YAML mapping"
    return loaded


def _triggers(workflow: dict[Any, Any]) -> Any:
    # YAML 1.1 reads the key `on` as the boolean true.
    return workflow.get("on", workflow.get(True))


def _steps(workflow: dict[Any, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    for job_id, job in workflow["jobs"].items():
        for step in job.get("steps", []):
            yield job_id, step


def _run_blocks() -> Iterator[tuple[str, str]]:
    for path in WORKFLOWS:
        for job_id, step in _steps(_load(path)):
            if "run" in step:
                yield f"{path.name}:{job_id}:{step.get('name', '?')}", str(step["run"])


def _merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """GitLab's ``extends``: hashes merge deeply, everything else is replaced."""
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def gitlab_jobs() -> dict[str, dict[str, Any]]:
    doc = _load(GITLAB)
    jobs = {}
    for name, body in doc.items():
        if name in GITLAB_KEYWORDS or str(name).startswith("."):
            continue
        resolved: dict[str, Any] = {}
        parents = body.get("extends", [])
        for parent in [parents] if isinstance(parents, str) else parents:
            resolved = _merge(resolved, doc[parent])
        jobs[name] = _merge(resolved, body)
    return jobs


def _gitlab_script_lines() -> Iterator[tuple[str, str]]:
    for name, job in gitlab_jobs().items():
        for key in ("before_script", "script", "after_script"):
            for line in job.get(key, []):
                yield f"{GITLAB.name}:{name}:{key}", str(line)


def _every_shell_text() -> list[tuple[str, str]]:
    return [*_run_blocks(), *_gitlab_script_lines(),
            *((path.name, path.read_text()) for path in SCRIPTS)]


# -- the tests -----------------------------------------------------------------------

def test_the_ci_files_exist() -> None:
    assert {p.name for p in WORKFLOWS} == {"gate.yml", "nightly.yml"}
    assert {p.name for p in SCRIPTS} >= {"gate.sh", "nightly.sh"}
    assert GITLAB.is_file()


def _zizmor(*paths: Path) -> subprocess.CompletedProcess[str]:
    zizmor = Path(sys.executable).with_name("zizmor")
    assert zizmor.is_file(), f"{zizmor} is missing: run scripts/setup.sh (the dev extra)"
    return subprocess.run(
        [str(zizmor), "--offline", "--config", str(ZIZMOR_CONFIG), "--format", "json",
         *map(str, paths)], capture_output=True, text=True, timeout=120, check=False)


def test_zizmor_finds_nothing_in_the_workflows() -> None:
    done = _zizmor(*WORKFLOWS)
    findings = json.loads(done.stdout)
    assert findings == [], json.dumps(findings, indent=2)[:4000]
    assert done.returncode == 0, done.stderr[-2000:]


def test_zizmor_with_this_config_still_reports_a_real_problem(tmp_path: Path) -> None:
    # The config relaxes one rule for GitHub's own actions; an injection is still caught.
    bad = tmp_path / "bad.yml"
    bad.write_text(
        "name: bad\non: pull_request\npermissions: {}\njobs:\n  j:\n"
        "    runs-on: ubuntu-24.04\n    timeout-minutes: 5\n    steps:\n"
        "      - run: echo \"${{ github.event.pull_request.title }}\"\n")
    done = _zizmor(bad)
    assert done.returncode != 0
    assert "template-injection" in {finding["ident"] for finding in json.loads(done.stdout)}


def test_every_job_has_a_timeout_and_least_privilege() -> None:
    for path in WORKFLOWS:
        workflow = _load(path)
        assert workflow.get("permissions") == {}, f"{path.name}: workflow-wide permissions"
        for job_id, job in workflow["jobs"].items():
            assert isinstance(job.get("timeout-minutes"), int), f"{path.name}:{job_id}"
            assert job.get("permissions") == {"contents": "read"}, f"{path.name}:{job_id}"
    for name, job in gitlab_jobs().items():
        assert job.get("timeout"), f"{GITLAB.name}:{name} has no timeout"
        assert job.get("tags"), f"{GITLAB.name}:{name} names no runner tags"


def test_the_gate_cancels_superseded_pull_request_runs() -> None:
    gate = _load(WORKFLOW_DIR / "gate.yml")
    assert "pull_request" in _triggers(gate)
    concurrency = gate["concurrency"]
    assert "github.event.pull_request.number" in concurrency["group"]
    assert "pull_request" in str(concurrency["cancel-in-progress"])
    nightly = _load(WORKFLOW_DIR / "nightly.yml")
    assert {"schedule", "workflow_dispatch"} <= set(_triggers(nightly))
    assert nightly["concurrency"]["group"]


def test_artifacts_expire() -> None:
    uploads = [(job, step) for path in WORKFLOWS for job, step in _steps(_load(path))
               if str(step.get("uses", "")).startswith("actions/upload-artifact@")]
    assert uploads
    for job, step in uploads:
        assert isinstance(step["with"].get("retention-days"), int), job
    for name, gitlab_job in gitlab_jobs().items():
        assert gitlab_job.get("artifacts", {}).get("expire_in"), f"{GITLAB.name}:{name}"


def test_actions_are_pinned_to_a_version() -> None:
    for path in WORKFLOWS:
        for job, step in _steps(_load(path)):
            if "uses" in step:
                assert re.fullmatch(r"[\w.-]+/[\w.-]+@(v\d+|[0-9a-f]{40})", step["uses"]), \
                    f"{path.name}:{job}: {step['uses']}"


def _strings(node: Any, trail: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], str]]:
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _strings(value, (*trail, str(key)))
    elif isinstance(node, list):
        for item in node:
            yield from _strings(item, trail)
    elif isinstance(node, str):
        yield trail, node


#: A literal credential: a known token prefix, or a long run of letters and digits mixed.
_LITERAL_TOKEN = re.compile(r"\b(?:ghp_|gho_|ghs_|github_pat_|glpat-)\w+"
                            r"|\b(?=[A-Za-z0-9]*\d)(?=[A-Za-z0-9]*[A-Za-z])[A-Za-z0-9]{32,}\b")


def secret_problems(text: str, where: str) -> list[str]:
    """A command line that would show a secret in a log or a process listing."""
    problems = []
    if "secrets." in text:
        problems.append(f"{where}: names a secret on a command line (use env:)")
    if re.search(r"\$\{?HARNESS_SERVICE_TOKEN\b", text):
        problems.append(f"{where}: expands the token on a command line (the harness reads "
                        "HARNESS_SERVICE_TOKEN from the environment)")
    if any("--token" in args for args in harness_commands(text)):
        problems.append(f"{where}: passes --token (read from the environment instead)")
    if _LITERAL_TOKEN.search(text):
        problems.append(f"{where}: holds what looks like a literal token")
    return problems


def test_secrets_appear_only_in_env() -> None:
    for path in WORKFLOWS:
        for trail, value in _strings(_load(path)):
            if "secrets." in value:
                assert "env" in trail, f"{path.name}: secret outside env: at {'.'.join(trail)}"
    problems = [p for where, text in _every_shell_text() for p in secret_problems(text, where)]
    assert problems == []
    gitlab_variables = json.dumps([_load(GITLAB).get("variables", {}),
                                   *(job.get("variables", {}) for job in gitlab_jobs().values())])
    assert "HARNESS_SERVICE_TOKEN" not in gitlab_variables


def test_the_secret_checker_catches_each_kind_of_leak() -> None:
    leaks = {
        "secrets": "echo ${{ secrets.HARNESS_SERVICE_TOKEN }}",
        "expanded": 'curl -H "Authorization: Bearer $HARNESS_SERVICE_TOKEN" "$URL"',
        "option": 'harness upload --url "$U" --run-json r --results a --token "$T"',
        "literal": "export T=ghp_" + "a1" * 18,
    }
    for name, text in leaks.items():
        assert secret_problems(text, name), name
    assert secret_problems("ci/scripts/gate.sh \"$BACKEND\"", "clean") == []


def test_every_harness_command_and_plugin_option_exists() -> None:
    problems = [p for where, text in _every_shell_text() for p in check_commands(text, where)]
    assert problems == []
    # The extraction found the commands the gate is made of (so the check above is real).
    used = {args[0] for _, text in _every_shell_text() for args in harness_commands(text)}
    assert used >= {"base-image", "build", "report", "upload", "compare"}, used
    options = set().union(*(re.findall(r"--harness-[a-z-]*[a-z]", text)
                            for _, text in _every_shell_text()))
    assert options >= {"--harness-runner", "--harness-image", "--harness-build",
                       "--harness-require-gpu", "--harness-run-record"}, options


@pytest.mark.parametrize(("text", "says"), [
    ("harness run --no-such-option", "--no-such-option"),
    ('x=$(harness build --backend "$B" --containr | tail -n 1)', "--containr"),
    ("harness buidl --backend cpu", "buidl"),
    ("harness build --backend tpu", "tpu"),
    ("harness compare --baseline main \\\n  --widow 5", "--widow"),
    ('harness upload --url "$URL" --run-json "$R"', "--results"),
    ("python3 -m pytest suites --harness-no-such=1", "--harness-no-such"),
    ("cd x && python3 -m pytest suites --alurdir out", "--alurdir"),
    ("python3 -m pytest suites --harness-runner docker", "docker"),
    ("args+=(--harness-require-gpu=metal)", "metal"),
])
def test_the_checker_catches_a_wrong_command(text: str, says: str) -> None:
    problems = check_commands(f"set -e\n{text}\n", "sample.yml")
    assert problems, text
    assert says in problems[0]


def test_the_checker_accepts_shell_variables_and_substitutions() -> None:
    text = ('image=$(harness build --backend "$backend" --container | tail -n 1)\n'
            'harness compare --service "$URL" --baseline "$B" --current "$ID" \\\n'
            '  --window "$W" --output "$SUMMARY" || rc=$?\n'
            "python3 - <<'PY'\nharness nonsense --in a heredoc\nPY\n"
            '# harness build --commented-out\n')
    assert len(harness_commands(text)) == 2
    assert check_commands(text, "ok.sh") == []


def test_scripts_the_ci_files_call_exist_and_parse() -> None:
    called = {words[0] for _, text in [*_run_blocks(), *_gitlab_script_lines()]
              for words in shell_commands(text) if words[0].startswith("ci/scripts/")}
    assert called == {"ci/scripts/gate.sh", "ci/scripts/nightly.sh"}
    for rel in called:
        assert os.access(ROOT / rel, os.X_OK), f"{rel} is not executable"
    for script in SCRIPTS:
        done = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True,
                              check=False)
        assert done.returncode == 0, f"{script.name}: {done.stderr}"


def _nightly_cells_github() -> set[tuple[str, str, str]]:
    matrix = _load(WORKFLOW_DIR / "nightly.yml")["jobs"]["nightly"]["strategy"]["matrix"]
    cells = {(b, u, c) for b in matrix["backend"] for u in matrix["bundle"]
             for c in matrix["gpu-config"]}
    for rule in matrix.get("exclude", []):
        cells = {cell for cell in cells
                 if not all(cell[("backend", "bundle", "gpu-config").index(k)] == v
                            for k, v in rule.items())}
    return cells


def _nightly_cells_gitlab() -> set[tuple[str, str, str]]:
    cells = set()
    for row in gitlab_jobs()["nightly"]["parallel"]["matrix"]:
        def values(key: str, row: dict[str, Any] = row) -> list[str]:
            value = row[key]
            return value if isinstance(value, list) else [value]
        cells |= {(b, u, c) for b in values("BACKEND") for u in values("BUNDLE")
                  for c in values("GPU_CONFIG")}
    return cells


def test_the_nightly_matrix_covers_every_card_on_its_backends() -> None:
    expected = {(backend.value, bundle, config.name)
                for config in load_gpu_configs() for backend in config.backends
                for bundle in modelgen.BUNDLE_NAMES}
    assert {cell[0] for cell in expected} <= GPU_BACKENDS
    assert _nightly_cells_github() == expected
    assert _nightly_cells_gitlab() == expected


def test_gpu_jobs_run_on_labelled_self_hosted_runners() -> None:
    gate = _load(WORKFLOW_DIR / "gate.yml")["jobs"]
    assert gate["cpu"]["runs-on"] == "ubuntu-24.04"
    assert set(gate["gpu"]["strategy"]["matrix"]["backend"]) == GPU_BACKENDS
    assert gate["gpu"]["runs-on"] == ["self-hosted", "linux", "${{ matrix.backend }}"]
    gitlab = gitlab_jobs()
    assert gitlab["gate:gpu"]["tags"] == ["$BACKEND"]
    assert {row["BACKEND"] for row in gitlab["nightly"]["parallel"]["matrix"]} == GPU_BACKENDS


#: The suite the multi-GPU cells run: one model spread over the runner's cards.
MULTI_DEVICE_SUITE = "suites/test_multi_device.py"


def test_the_multi_gpu_cells_run_the_multi_device_suite_on_multi_gpu_runners() -> None:
    gate = _load(WORKFLOW_DIR / "gate.yml")["jobs"]
    github = gate["multi-gpu"]
    assert set(github["strategy"]["matrix"]["backend"]) == GPU_BACKENDS
    assert github["runs-on"] == ["self-hosted", "linux", "${{ matrix.backend }}", "multi-gpu"]
    # Only where the gpu job runs: never a fork's pull request on a self-hosted runner.
    assert github["if"] == gate["gpu"]["if"]
    assert any("ci/scripts/gate.sh" in str(step.get("run", "")) for step in github["steps"])
    # upload-artifact refuses a name another job of the run already uploaded.
    names = [step["with"]["name"] for job in gate.values() for step in job["steps"]
             if str(step.get("uses", "")).startswith("actions/upload-artifact@")]
    assert len(names) == len(set(names)), names

    jobs = gitlab_jobs()
    gitlab = jobs["gate:multi-gpu"]
    assert gitlab["tags"] == ["$BACKEND", "multi-gpu"]
    assert {backend for row in gitlab["parallel"]["matrix"] for backend in row["BACKEND"]} \
        == GPU_BACKENDS
    assert gitlab["rules"] == jobs["gate:gpu"]["rules"]
    assert gitlab["script"] == jobs["gate:gpu"]["script"]

    script = GATE.read_text()
    for where, env in [("gate.yml:multi-gpu", github["env"]),
                       (".gitlab-ci.yml:gate:multi-gpu", gitlab["variables"])]:
        assert int(env["HARNESS_GATE_GPU_COUNT"]) >= 2, where
        suites = str(env["HARNESS_GATE_SUITES"]).split()
        assert MULTI_DEVICE_SUITE in suites, where
        for suite in suites:
            assert (ROOT / suite.partition("::")[0]).exists(), f"{where}: {suite}"
    # The settings the cells set are the ones the gate reads.
    for name in ("HARNESS_GATE_GPU_COUNT", "HARNESS_GATE_SUITES"):
        assert re.search(r"\$\{" + name + r":-", script), name


def _gate_env(tmp_path: Path, **settings: str) -> dict[str, str]:
    """A job's environment for gate.sh, nothing of this shell's CI or harness settings in it.

    Should a setting get past the refusals, the build fails at once (a missing source
    tree, an empty cache) instead of building.
    """
    env = {name: value for name, value in os.environ.items()
           if not name.startswith(("HARNESS_", "GITHUB_", "CI_"))}
    env.update({
        "HARNESS_GATE_RUNNER": "subprocess",
        "HARNESS_GATE_OUT": str(tmp_path / "out"),
        "HARNESS_GATE_SUMMARY": str(tmp_path / "summary.md"),
        "HARNESS_CACHE": str(tmp_path / "cache"),
        "HARNESS_SOURCE": str(tmp_path / "no-such-llama.cpp"),
        **settings,
    })
    return env


@pytest.mark.parametrize(("setting", "value", "says"), [
    ("HARNESS_GATE_GPU_COUNT", "0", "HARNESS_GATE_GPU_COUNT must be a whole number of 1 or more"),
    ("HARNESS_GATE_GPU_COUNT", "x", "HARNESS_GATE_GPU_COUNT must be a whole number of 1 or more"),
    ("HARNESS_GATE_GPU_COUNT", "2.5", "not '2.5'"),
    ("HARNESS_GATE_SUITES", f"{MULTI_DEVICE_SUITE} suites/test_no_such_suite.py",
     "HARNESS_GATE_SUITES names 'suites/test_no_such_suite.py'"),
])
def test_the_gate_refuses_a_bad_gpu_count_or_suite_before_building(
        tmp_path: Path, setting: str, value: str, says: str) -> None:
    done = subprocess.run([str(GATE), "cuda"], env=_gate_env(tmp_path, **{setting: value}),
                          capture_output=True, text=True, timeout=60, check=False)
    detail = f"exit {done.returncode}\n{done.stderr[-4000:]}"
    assert done.returncode == 2, detail
    assert says in done.stderr, detail
    # Refused before the build and the suites: nothing was built, run or recorded.
    assert "harness build" not in done.stderr, detail
    assert "--source" not in done.stderr, detail
    assert "gate: suites exit" not in done.stderr, detail
    assert not (tmp_path / "out" / "run.json").exists()
    assert not (tmp_path / "cache").exists()


_RECORDER = """#!/usr/bin/env bash
printf '%s\\n' "$(basename "$0")" "$@" >>"$GATE_CALLS"
printf '%s\\n' '---' >>"$GATE_CALLS"
[ "$(basename "$0")" = python3 ] || echo /stand-in/llama-server
"""


def _gate_calls(tmp_path: Path, backend: str, **settings: str) -> list[list[str]]:
    """The commands gate.sh runs (``harness`` and ``python3``, both stand-ins), each as its
    words: a copy of the script in a bare checkout, so no .venv puts the real ones first."""
    script, bin_dir = bare_gate(tmp_path, _RECORDER, files=[MULTI_DEVICE_SUITE])
    calls = tmp_path / "calls"
    env = _gate_env(tmp_path, **settings)
    env.update({"PATH": f"{bin_dir}{os.pathsep}{env.get('PATH', '')}",
                "GATE_CALLS": str(calls)})
    done = subprocess.run([str(script), backend], env=env, capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 0, f"exit {done.returncode}\n{done.stderr[-4000:]}"
    words = calls.read_text().split("\n---\n")
    return [call.split("\n") for call in words if call.strip()]


@pytest.mark.parametrize(("backend", "count", "required"), [
    ("cuda", "2", ["--harness-require-gpu", "cuda:2"]),
    ("rocm", "1", ["--harness-require-gpu", "rocm"]),
    ("vulkan", "", ["--harness-require-gpu", "vulkan"]),
    ("cpu", "2", []),
])
def test_the_gate_passes_its_gpu_count_and_suites_to_pytest(
        tmp_path: Path, backend: str, count: str, required: list[str]) -> None:
    calls = _gate_calls(tmp_path, backend, HARNESS_GATE_GPU_COUNT=count,
                        HARNESS_GATE_SUITES=f" {MULTI_DEVICE_SUITE} ")
    pytest_calls = [call[3:] for call in calls if call[:3] == ["python3", "-m", "pytest"]]
    assert len(pytest_calls) == 1, calls
    args = pytest_calls[0]
    assert args[0] == MULTI_DEVICE_SUITE
    assert "suites" not in args
    found = [args[i:i + 2] for i, word in enumerate(args) if word == "--harness-require-gpu"]
    assert found == ([required] if required else []), args


def test_the_gate_runs_every_suite_by_default(tmp_path: Path) -> None:
    calls = _gate_calls(tmp_path, "cuda")
    args = next(call[3:] for call in calls if call[:3] == ["python3", "-m", "pytest"])
    assert args[0] == "suites"
    assert args[args.index("--harness-require-gpu") + 1] == "cuda"
