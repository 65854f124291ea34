"""The headers a file of a stored Allure report is served with (pure).

The report is the service's own origin, and its attachments are whatever a test run
attached: a captured HTML page, an SVG, a log that happens to look like markup. So an
attachment is served inside a sandbox (``Content-Security-Policy: sandbox``: no
script, no same-origin access even if a browser renders it), and a type a browser
would run is sent as a download. The report's own pages and data need none of this:
its app fetches attachments with ``fetch()``, which neither header affects, so the
report still shows them.
"""

from __future__ import annotations

import mimetypes
from pathlib import Path

#: Where Allure 3's awesome report keeps attachments, relative to the report root.
ATTACHMENTS = Path("data", "attachments")

#: Types a browser renders with script or markup; sent as downloads when attached.
_ACTIVE_TYPES = frozenset({
    "text/html", "application/xhtml+xml", "image/svg+xml", "text/xml", "application/xml",
    "text/javascript", "application/javascript", "application/x-javascript",
    "application/pdf", "text/xsl", "application/xslt+xml",
})


def is_attachment(report_root: Path, target: Path) -> bool:
    return target.is_relative_to(report_root / ATTACHMENTS)


def report_file_headers(report_root: Path, target: Path) -> dict[str, str]:
    """Headers for serving ``target``, a file inside the report at ``report_root``."""
    headers = {"X-Content-Type-Options": "nosniff"}
    if is_attachment(report_root, target):
        headers["Content-Security-Policy"] = "sandbox"
        media, _ = mimetypes.guess_type(target.name)
        # An unknown type is sent as a download too: it is not worth guessing about.
        if media is None or media in _ACTIVE_TYPES:
            headers["Content-Disposition"] = "attachment"
    return headers
