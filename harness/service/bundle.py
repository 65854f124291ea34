"""The run bundle: a gzip tarball with ``run.json`` and the run's ``allure-results/``.

The client packs one with :func:`make_bundle`; the service unpacks uploads with
``harness.service.bundle_extract.safe_extract``, which trusts nothing in the archive
(the checks are listed there). Both refuse with :class:`BundleRejectedError`, whose
message is bounded and quotes untrusted names and error texts cut short
(:func:`quote_untrusted`), so an error body stays small whatever the upload holds.
"""

from __future__ import annotations

import tarfile
from pathlib import Path

from harness.errors import HarnessError

RUN_JSON = "run.json"
RESULTS = "allure-results"

#: Untrusted text (a member name, an exception's message) quoted in a refusal is cut
#: to this many characters, and a whole message to this many UTF-8 bytes: the service
#: sends it back as the error body, which must stay far under 4 KiB.
_SHOWN_CHARS = 200
_MAX_MESSAGE_BYTES = 1500


def _bounded(message: str) -> str:
    """``message`` with control characters escaped, cut to ``_MAX_MESSAGE_BYTES``."""
    head = message[:_MAX_MESSAGE_BYTES]
    if not head.isprintable():
        head = "".join(char if char.isprintable() else repr(char)[1:-1] for char in head)
    data = head.encode("utf-8", "backslashreplace")
    if len(message) <= _MAX_MESSAGE_BYTES and len(data) <= _MAX_MESSAGE_BYTES:
        return head
    return data[:_MAX_MESSAGE_BYTES].decode("utf-8", "ignore") + " … (message shortened)"


def quote_untrusted(text: object) -> str:
    """Untrusted ``text`` fit to quote in a refusal: cut to ``_SHOWN_CHARS`` characters.

    A name (a ``str``) is shown as its repr, which escapes control characters, as the
    messages always did; anything else (an exception) as its escaped text. A cut one
    says how long it really is.
    """
    raw = text if isinstance(text, str) else str(text)
    shown = repr(raw[:_SHOWN_CHARS])
    if not isinstance(text, str):
        shown = shown[1:-1]
    if len(raw) > _SHOWN_CHARS:
        shown += f"… ({len(raw)} characters)"
    return shown


class BundleRejectedError(HarnessError):
    """An uploaded bundle that the service will not store; the message says why.

    The message is bounded (:func:`_bounded`) whoever builds it: it goes back to the
    uploader as the error body and may quote what the upload holds.
    """

    def __init__(self, message: str) -> None:
        super().__init__(_bounded(message))


class BundleTooLargeError(BundleRejectedError):
    """A bundle over the service's size or member limits."""


def make_bundle(run_json: Path, results_dir: Path, out: Path) -> Path:
    """Pack ``run_json`` and ``results_dir`` into the gzip tarball ``out``.

    Only regular files and directories go in (the service refuses anything else), with
    owner and times zeroed so the same inputs make the same archive.
    """
    if not run_json.is_file():
        raise BundleRejectedError(f"{run_json}: no such run.json; pass the run.json the "
                                  "harness wrote for the run")
    if not results_dir.is_dir():
        raise BundleRejectedError(f"{results_dir}: no such allure results directory; pass "
                                  "the --alluredir of the run")
    out.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(out, "w:gz", format=tarfile.PAX_FORMAT) as tar:
        tar.add(run_json, arcname=RUN_JSON, recursive=False, filter=_normalise)
        tar.add(results_dir, arcname=RESULTS, recursive=False, filter=_normalise)
        for path in sorted(results_dir.rglob("*")):
            if path.is_symlink() or not (path.is_file() or path.is_dir()):
                raise BundleRejectedError(
                    f"{path}: not a regular file or directory; the bundle carries only "
                    "plain files, so remove it from the results directory")
            arcname = f"{RESULTS}/{path.relative_to(results_dir).as_posix()}"
            tar.add(path, arcname=arcname, recursive=False, filter=_normalise)
    return out


def _normalise(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    info.mtime = 0
    info.mode = 0o755 if info.isdir() else 0o644
    return info

