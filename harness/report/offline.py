"""A report that asks nothing of the internet: Allure's analytics tags taken out (pure).

Allure 3's Awesome plugin writes a Google Analytics loader into every ``index.html``
(``plugin-awesome/dist/generators.js``: ``analyticsEnable`` is hard-wired to true, and
no setting or variable turns it off). Opened on a GPU runner with no way out, the page
asks for a script it cannot get; opened anywhere else, it tells a third party that a
report was viewed, with the report's id and the Allure version. Neither belongs
in a regression report, so the harness removes the two tags after Allure wrote them:
the external ``gtag.js`` loader and the inline script that configures it.

The patterns are the template's own shape (one ``<script async src=…gtag/js…>`` and
one ``<script>`` whose body calls ``gtag(``); ``untracked_html`` refuses to guess
beyond them, and ``external_script_sources`` lets a test prove nothing is left.
"""

from __future__ import annotations

import re
from pathlib import Path

#: The loader tag: an external script from Google's tag manager. Its attributes are
#: matched one by one (quoted values only), so a tag with a megabyte ``data:`` source
#: is passed over at once instead of searched.
_LOADER = re.compile(
    r'[ \t]*<script(?:\s+[a-z-]+(?:="[^"]*")?)*?\s+src="https://www\.googletagmanager\.com/'
    r'[^"]*"(?:\s+[a-z-]+(?:="[^"]*")?)*\s*>\s*</script>[ \t]*\n?')
#: An inline script (no attributes): its body cannot hold ``</script>``, so the lazy
#: match ends at its own closing tag.
_INLINE = re.compile(r"[ \t]*<script>(.*?)</script>[ \t]*\n?", re.DOTALL)
_GTAG_CALL = re.compile(r"\bgtag\s*\(")
#: Any external script a page would fetch (``src`` with a scheme and a host).
_EXTERNAL_SRC = re.compile(r'<script\b[^>]*\bsrc="((?:https?:)?//[^"]+)"', re.IGNORECASE)


def untracked_html(html: str) -> str:
    """``html`` without Allure's analytics loader and its configuration script."""
    without_loader = _LOADER.sub("", html)
    return _INLINE.sub(lambda script: "" if _GTAG_CALL.search(script.group(1))
                       else script.group(0), without_loader)


def external_script_sources(html: str) -> list[str]:
    """The URLs of every script ``html`` would load from another host."""
    return _EXTERNAL_SRC.findall(html)


def untrack_report(report_dir: Path) -> int:
    """Take the analytics tags out of the report's own pages at ``report_dir`` (its top
    folder: attachments below ``data/`` are the tests' files and stay as they were); the
    number of pages changed. A page is rewritten only when something was removed."""
    changed = 0
    for page in sorted(report_dir.glob("*.html")):
        text = page.read_text(encoding="utf-8", errors="surrogateescape")
        cleaned = untracked_html(text)
        if cleaned != text:
            page.write_text(cleaned, encoding="utf-8", errors="surrogateescape")
            changed += 1
    return changed
