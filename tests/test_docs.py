"""The documentation stays true to the code: the README is short and links every page of
``docs/``, every relative link leads to a file, and every ``HARNESS_*`` variable, every
``harness`` command and option and every ``--harness-*`` pytest option is documented.

The docs are read as text and the code through what it declares (the click commands the
``harness`` group is built from, the plugin's ``OPTIONS`` table, the tuned settings'
table), so a new variable, command or option without a line in the docs fails here.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import click
from checkout import REPO_ROOT

from harness.commands import command_modules, command_of
from harness.facts.gpu import SETTING_FIELDS
from harness.planning.autotune import ENV_PREFIX
from harness.plugin.session import OPTIONS

README = REPO_ROOT / "README.md"
DOCS = REPO_ROOT / "docs"
MAX_README_LINES = 250
#: The two commands the README's first screen names.
TWO_COMMANDS = ("bash scripts/main.sh", "bash scripts/test.sh")
#: Where the variables the harness reads are named: its code, its suites, its scripts,
#: its CI files and the CI entry point.
VARIABLE_SOURCES = ("harness", "suites", "scripts", "ci", ".ci/run")
VARIABLE = re.compile(r"HARNESS_[A-Z0-9_]+")
#: ``[text](target)``; a target may carry a title after a space.
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)(?:\s[^)]*)?\)")
SKIPPED_PARTS = {"__pycache__"}


def _pages() -> list[Path]:
    return sorted(DOCS.glob("*.md"))


def _documents() -> list[Path]:
    return [README, *_pages()]


def _text(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def relative_links(markdown: str) -> list[str]:
    """Every link target that is a path: no URL scheme, no mail, no bare ``#anchor``;
    the ``#anchor`` of a path is dropped."""
    found = []
    for target in LINK.findall(markdown):
        if re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue
        found.append(target.split("#", 1)[0])
    return found


def mentions(text: str, word: str) -> bool:
    """``word`` occurs in ``text`` as a whole name: not as part of a longer variable or
    option (``HARNESS_GATE_BASE`` is not mentioned by ``HARNESS_GATE_BASELINE``, nor
    ``--results`` by ``--results-url``)."""
    return re.search(rf"(?<![\w-]){re.escape(word)}(?![\w-])", text) is not None


def test_the_helpers_read_links_and_whole_names() -> None:
    sample = ("[a](docs/x.md#part) [b](http://127.0.0.1/y) [c](#here) "
              '[d](../ci/README.md "title") [e](mailto:someone)')
    assert relative_links(sample) == ["docs/x.md", "../ci/README.md"]
    assert mentions("`HARNESS_GATE_BASE` and more", "HARNESS_GATE_BASE")
    assert not mentions("`HARNESS_GATE_BASELINE`", "HARNESS_GATE_BASE")
    assert not mentions("`--results-url URL`", "--results")
    assert mentions("(`--results DIR`)", "--results")


def test_the_readme_is_short() -> None:
    lines = len(_text(README).splitlines())
    assert lines <= MAX_README_LINES, (
        f"README.md has {lines} lines (at most {MAX_README_LINES}): move reference "
        f"material into a page under docs/ and link it")


def test_the_readme_names_the_two_commands() -> None:
    text = _text(README)
    missing = [command for command in TWO_COMMANDS if command not in text]
    assert not missing, f"README.md does not name {missing}"


def test_the_readme_links_every_page_and_no_page_is_orphaned() -> None:
    pages = _pages()
    assert pages, "docs/ holds pages"
    linked = {(README.parent / target).resolve() for target in relative_links(_text(README))}
    unlinked = [page.name for page in pages if page.resolve() not in linked]
    assert not unlinked, f"docs/ pages the README does not link: {unlinked}"


def test_every_page_starts_with_a_title_and_a_one_line_summary() -> None:
    bad = []
    for page in _pages():
        lines = _text(page).splitlines()
        if (len(lines) < 3 or not lines[0].startswith("# ") or lines[1] != ""
                or not lines[2].strip() or lines[2].startswith("#")):
            bad.append(page.name)
    assert not bad, f"pages without '# Title', a blank line and a one-line summary: {bad}"


def test_every_relative_link_leads_to_a_file() -> None:
    broken = [f"{doc.relative_to(REPO_ROOT)}: {target}"
              for doc in _documents() for target in relative_links(_text(doc))
              if target and not (doc.parent / target).exists()]
    assert not broken, "links to nothing: " + ", ".join(broken)


def _source_files() -> Iterator[Path]:
    for name in VARIABLE_SOURCES:
        root = REPO_ROOT / name
        paths = [root] if root.is_file() else sorted(root.rglob("*"))
        for path in paths:
            if path.is_file() and not SKIPPED_PARTS & set(path.parts):
                yield path


def variables_in_sources() -> dict[str, str]:
    """Every ``HARNESS_*`` name the sources hold, with the first file that names it.
    Files are read as text; bytes that are not UTF-8 (a binary file) are ignored."""
    found: dict[str, str] = {}
    for path in _source_files():
        text = path.read_bytes().decode("utf-8", errors="ignore")
        for name in VARIABLE.findall(text):
            found.setdefault(name, str(path.relative_to(REPO_ROOT)))
    return found


def undocumented_variables(found: dict[str, str], doc: str) -> list[str]:
    """The names of ``found`` that ``doc`` does not list.

    The rule: a name is listed when ``doc`` holds it as a whole name. A name that ends
    in ``_`` is a prefix the code completes at run time (``HARNESS_LLAMA_`` + a setting's
    name): it is listed when ``doc`` holds a row for the family, the prefix followed by
    a placeholder in angle brackets (``HARNESS_LLAMA_<SETTING>``). The members of the one
    family built from a table in code are checked one by one in
    :func:`test_every_tuned_setting_variable_is_documented`.
    """
    missing = []
    for name, where in sorted(found.items()):
        listed = (re.search(re.escape(name) + r"<[A-Z_]+>", doc) is not None
                  if name.endswith("_") else mentions(doc, name))
        if not listed:
            missing.append(f"{name} (in {where})")
    return missing


def test_the_variable_rule_tells_a_prefix_from_a_name() -> None:
    doc = "| `HARNESS_LLAMA_<SETTING>` | … | `HARNESS_CACHE` |"
    assert undocumented_variables({"HARNESS_LLAMA_": "a", "HARNESS_CACHE": "b"}, doc) == []
    assert undocumented_variables({"HARNESS_CACHE_": "a"}, doc) == ["HARNESS_CACHE_ (in a)"]
    assert undocumented_variables({"HARNESS_CACH": "c"}, doc) == ["HARNESS_CACH (in c)"]


def test_every_variable_the_code_reads_is_documented() -> None:
    found = variables_in_sources()
    assert {"HARNESS_CACHE", "HARNESS_GATE_RUNNER"} <= set(found), "the sources were read"
    missing = undocumented_variables(found, _text(DOCS / "environment.md"))
    assert not missing, f"HARNESS_* names missing from docs/environment.md: {missing}"


def test_every_tuned_setting_variable_is_documented() -> None:
    """``HARNESS_LLAMA_*`` is built from ``SETTING_FIELDS``: each member is named in full."""
    doc = _text(DOCS / "environment.md")
    names = [ENV_PREFIX + field.name.upper() for field in SETTING_FIELDS]
    assert "HARNESS_LLAMA_CTX_SIZE" in names
    missing = [name for name in names if not mentions(doc, name)]
    assert not missing, f"tuned-setting variables missing from docs/environment.md: {missing}"


def command_sections(doc: str) -> dict[str, str]:
    """docs/commands.md cut at its ``## `harness NAME` `` headings: name → section text."""
    sections: dict[str, str] = {}
    parts = re.split(r"^## `harness ([a-z-]+)`\s*$", doc, flags=re.MULTILINE)
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        sections[name] = body
    return sections


def _long_options(command: click.Command) -> list[str]:
    return sorted({opt for param in command.params if isinstance(param, click.Option)
                   for opt in (*param.opts, *param.secondary_opts) if opt.startswith("--")})


def test_every_command_and_each_of_its_options_is_documented() -> None:
    doc = _text(DOCS / "commands.md")
    sections = command_sections(doc)
    names = command_modules()
    assert {"run", "base_image"} <= set(names), "the command modules were listed"
    problems = []
    for module in names:
        command = command_of(module)
        assert command.name is not None
        if not mentions(doc, f"harness {command.name}") or command.name not in sections:
            problems.append(f"harness {command.name}: no '## `harness {command.name}`' section")
            continue
        problems += [f"harness {command.name} {option}"
                     for option in _long_options(command)
                     if not mentions(sections[command.name], option)]
    assert not problems, f"missing from docs/commands.md: {problems}"


def test_the_commands_page_has_no_section_for_a_command_that_is_gone() -> None:
    known = {command_of(module).name for module in command_modules()}
    stale = sorted(set(command_sections(_text(DOCS / "commands.md"))) - known)
    assert not stale, f"docs/commands.md documents commands that do not exist: {stale}"


def test_every_harness_pytest_option_is_documented() -> None:
    doc = _text(DOCS / "plugin.md")
    assert OPTIONS, "the plugin declares its options"
    missing = [f"{spec.flag} ({spec.variable})" for spec in OPTIONS
               if not (mentions(doc, spec.flag) and mentions(doc, spec.variable))]
    assert not missing, f"--harness-* options missing from docs/plugin.md: {missing}"
