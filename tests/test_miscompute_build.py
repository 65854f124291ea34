"""The miscompute build: its patch against the pinned source, the variables that turn on
one kind of wrong number at a time, the patched tree shared with the slowed build, and
that the real server computes like the pinned build with nothing set and differently
with an error on."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from harness import modelgen
from harness.builds import patched
from harness.builds.miscompute import (
    MAX_AMOUNT,
    MISCOMPUTE_BY_NAME,
    MISCOMPUTE_KINDS,
    PATCH_PATH,
    PATCHED_FILES,
    SOURCE_FOLDER,
    MiscomputeKind,
    apply_patch,
    ensure_miscompute_build,
    miscompute_env,
)
from harness.builds.resolve import ensure_build
from harness.builds.source import SourceTree, fetch_pinned_source
from harness.client import ServerClient
from harness.errors import ConfigError, SourceError
from harness.planning.build_plan import BuildRequest
from harness.planning.launch import LaunchSpec
from harness.runners.subprocess_runner import SubprocessRunner

#: How many lines of the patched tree carry each kind's error (attn-scale: the masked
#: softmax and both flash-attention kernels).
ERROR_LINES = {"norm": 1, "rope": 1, "attn-scale": 3, "q4-dot": 1}


def _patched_paths() -> set[str]:
    lines = PATCH_PATH.read_text().splitlines()
    return {line.split()[1].removeprefix("b/") for line in lines if line.startswith("+++ ")}


def _enclosing(source: str, line: str, nth: int = 0) -> str:
    """The name of the C/C++ function whose body holds the ``nth`` occurrence of ``line``."""
    at = -1
    for _ in range(nth + 1):
        at = source.index(line, at + 1)
    heads = list(re.finditer(r"^(?:static )?void (\w+)\(", source[:at], re.MULTILINE))
    return heads[-1].group(1)


def _copy_patched_files(pinned: Path, into: Path) -> None:
    for path in PATCHED_FILES:
        (into / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(pinned / path, into / path)


def test_the_kinds_are_named_and_read_from_variables_of_their_own() -> None:
    assert [kind.name for kind in MISCOMPUTE_KINDS] == ["norm", "rope", "attn-scale", "q4-dot"]
    envs = [kind.env for kind in MISCOMPUTE_KINDS]
    assert len(set(envs)) == len(envs)
    assert all(env.startswith("HARNESS_WRONG_") for env in envs)
    assert all("parts per million" in kind.unit for kind in MISCOMPUTE_KINDS)
    assert set(MISCOMPUTE_BY_NAME) == set(ERROR_LINES)


def test_the_patch_touches_only_the_files_it_names() -> None:
    # The cheap test below copies only these files; a patch reaching further must say so.
    assert _patched_paths() == {str(path) for path in PATCHED_FILES}


def test_patch_applies_cleanly_to_the_pinned_source(harness_cache: Path,
                                                    tmp_path: Path) -> None:
    pinned = fetch_pinned_source(harness_cache)
    _copy_patched_files(pinned.path, tmp_path)

    apply_patch(tmp_path)  # --fuzz=0: every hunk lands exactly where it was written

    text = "".join((tmp_path / path).read_text() for path in PATCHED_FILES)
    original = "".join((pinned.path / path).read_text() for path in PATCHED_FILES)
    for kind in MISCOMPUTE_KINDS:
        assert f'"{kind.env}"' in text, kind  # each kind reads its own variable
        assert text.count(f"// harness: {kind.env}") == ERROR_LINES[kind.name], kind
        assert kind.env not in original
    # Each error sits in the kernel it is named for.
    ops = (tmp_path / PATCHED_FILES[0]).read_text()
    quants = (tmp_path / PATCHED_FILES[1]).read_text()
    assert _enclosing(ops, "harness_wrong::norm(); // harness") == \
        "ggml_compute_forward_rms_norm_f32"
    assert _enclosing(ops, "freq_scale *= harness_wrong::rope();") == \
        "ggml_compute_forward_rope_flt"
    attn = [_enclosing(ops, "scale *= harness_wrong::attn_scale();", nth)
            for nth in range(3)]
    assert attn == ["ggml_compute_forward_soft_max_f32",
                    "ggml_compute_forward_flash_attn_ext_f16_one_chunk",
                    "ggml_compute_forward_flash_attn_ext_tiled"]
    assert _enclosing(quants, "harness_wrong_q4_dot() : 1.0f") == "ggml_vec_dot_q4_0_q8_0"


def test_a_patch_that_does_not_apply_names_it_and_leaves_the_tree_alone(
        tmp_path: Path) -> None:
    target = tmp_path / PATCHED_FILES[0]
    target.parent.mkdir(parents=True)
    target.write_text("int main() { return 0; }\n")

    with pytest.raises(SourceError, match="does not apply") as error:
        apply_patch(tmp_path)

    assert str(PATCH_PATH) in str(error.value)
    assert str(PATCHED_FILES[1]) in str(error.value)  # the files to redo are named
    assert target.read_text() == "int main() { return 0; }\n"


def test_the_patched_tree_is_made_once_per_pin_and_patch(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pinned = tmp_path / "pinned"
    (pinned / "src").mkdir(parents=True)
    (pinned / "src" / "a.c").write_text("int a;\n")
    monkeypatch.setattr(patched, "fetch_pinned_source",
                        lambda cache: SourceTree(path=pinned, digest="d" * 64, origin="test"))
    patch = tmp_path / "edit.patch"
    patch.write_text("one\n")
    applied: list[Path] = []

    def apply(tree: Path) -> None:
        applied.append(tree)
        (tree / "src" / "a.c").write_text("int b;\n")

    def make() -> Path:
        return patched.patched_source(tmp_path / "cache", patch, SOURCE_FOLDER, apply=apply,
                                      lock_wait_s=5.0, lock_setting="test")

    tree = make()
    assert tree.parent == tmp_path / "cache" / SOURCE_FOLDER
    assert tree.name.startswith("d" * 16 + "-")
    assert (tree / "src" / "a.c").read_text() == "int b;\n"
    assert (pinned / "src" / "a.c").read_text() == "int a;\n"  # the pinned tree untouched
    assert len(applied) == 1
    assert applied[0] != tree  # patched in staging, renamed into place
    assert make() == tree
    assert len(applied) == 1  # made once

    patch.write_text("two\n")  # an edited patch gets a tree of its own
    other = make()
    assert other != tree
    assert len(applied) == 2
    assert sorted(p.name for p in tree.parent.iterdir() if not p.name.endswith(".lock")) == \
        sorted([tree.name, other.name])


def test_a_patch_that_fails_leaves_no_tree(tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    pinned = tmp_path / "pinned"
    pinned.mkdir()
    monkeypatch.setattr(patched, "fetch_pinned_source",
                        lambda cache: SourceTree(path=pinned, digest="e" * 64, origin="test"))
    patch = tmp_path / "edit.patch"
    patch.write_text("x\n")

    def apply(tree: Path) -> None:
        raise SourceError("does not apply")

    with pytest.raises(SourceError):
        patched.patched_source(tmp_path / "cache", patch, SOURCE_FOLDER, apply=apply,
                               lock_wait_s=5.0, lock_setting="test")
    home = tmp_path / "cache" / SOURCE_FOLDER
    assert [p.name for p in home.iterdir() if not p.name.endswith(".lock")] == []


def test_miscompute_env_turns_on_one_kind_and_off_the_others() -> None:
    base = {"PATH": "/bin", "HARNESS_WRONG_NORM": "7", "HARNESS_WRONG_Q4_DOT": "9"}
    env = miscompute_env("rope", 250, base)
    assert env == {"PATH": "/bin", "HARNESS_WRONG_ROPE": "250"}
    assert base["HARNESS_WRONG_NORM"] == "7"  # the caller's mapping is left alone
    assert miscompute_env(MISCOMPUTE_BY_NAME["q4-dot"], 0, base) == {
        "PATH": "/bin", "HARNESS_WRONG_Q4_DOT": "0"}
    for kind in MISCOMPUTE_KINDS:
        env = miscompute_env(kind.name, 1, base)
        assert [k for k in env if k.startswith("HARNESS_WRONG_")] == [kind.env]


def test_miscompute_env_defaults_to_this_process(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HARNESS_WRONG_ATTN_SCALE", "3")
    env = miscompute_env("norm", 500)
    assert env["HARNESS_WRONG_NORM"] == "500"
    assert "HARNESS_WRONG_ATTN_SCALE" not in env
    assert env["PATH"] == os.environ["PATH"]


@pytest.mark.parametrize(("kind", "amount", "message"), [
    ("norm", -1, "outside 0..10000000"),
    ("rope", MAX_AMOUNT + 1, "outside 0..10000000"),
    ("attn-scale", True, "not a whole number"),
    ("q4-dot", 1.5, "not a whole number"),
    ("q4-dot", "5", "not a whole number"),
    ("layer-norm", 5, "no miscompute kind 'layer-norm'; the kinds are norm, rope"),
])
def test_bad_amounts_and_kinds_are_refused(kind: str, amount: Any, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as raised:
        miscompute_env(kind, amount, {})
    if kind in MISCOMPUTE_BY_NAME:
        assert "parts per million" in str(raised.value)  # the unit, to fix the amount by


def test_a_kind_is_frozen() -> None:
    kind = MISCOMPUTE_KINDS[0]
    assert isinstance(kind, MiscomputeKind)
    with pytest.raises(AttributeError):
        kind.env = "X"  # type: ignore[misc]


PROMPT = "The old lighthouse keeper climbed the stairs"


def _greedy(runner: SubprocessRunner, model: Path) -> tuple[list[int], list[dict[str, float]]]:
    """The greedy tokens of a short completion, and each step's top-5 log-probs by token."""
    spec = LaunchSpec(model=model, ctx_size=512, parallel=1, threads=1)
    with runner.start(spec) as server, ServerClient(server.base_url) as client:
        body = client.completion(PROMPT, n_predict=32, n_probs=5, ignore_eos=True,
                                 return_tokens=True).raw
    tops = [{str(top["id"]): float(top["logprob"]) for top in step["top_logprobs"]}
            for step in body["completion_probabilities"]]
    return [int(t) for t in body["tokens"]], tops


@pytest.mark.server
# On a fresh cache the miscompute build compiles first (about 5 minutes on 2 cores; a
# minute or so with ccache warm from the pinned build).
@pytest.mark.timeout(1800)
def test_the_miscompute_server_is_wrong_only_when_asked(harness_cache: Path,
                                                       fixture_set: modelgen.FixtureSet,
                                                       tmp_path: Path) -> None:
    pinned = ensure_build(harness_cache, BuildRequest()).binary
    wrong = ensure_miscompute_build(harness_cache).binary
    model = fixture_set.model("bench")
    unset = {k: v for k, v in os.environ.items()
             if k not in {kind.env for kind in MISCOMPUTE_KINDS}}

    expected = _greedy(SubprocessRunner(pinned, tmp_path, env=unset), model)
    plain = _greedy(SubprocessRunner(wrong, tmp_path, env=unset), model)
    # 2000 ppm (x 1.002) moved a top-5 log-prob by ~0.05 on bench here; it passes 0.01
    # from about 60 ppm (below that any change, even 1 ppm, moves ~0.005-0.01: the f16
    # KV cache rounds a few values the other way), so the margin is wide.
    norm = _greedy(SubprocessRunner(wrong, tmp_path, env=miscompute_env("norm", 2000, unset)),
                   model)

    # Nothing set: the pinned build's numbers, to the bit.
    assert plain == expected
    # The same prompt, the same tokens up to where they part; the log-probs moved.
    moved = max(abs(step[token] - wrong_step[token])
                for step, wrong_step in zip(expected[1], norm[1], strict=True)
                for token in step.keys() & wrong_step.keys())
    assert moved > 0.01, (expected, norm)
