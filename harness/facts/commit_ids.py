"""How a commit a bisect probed is named in one short word: the first 12 digits of a git
commit id, or the whole ``release:<N>`` of a published release."""

from __future__ import annotations

RELEASE_PREFIX = "release:"


def short_commit(commit_id: str) -> str:
    return commit_id if commit_id.startswith(RELEASE_PREFIX) else commit_id[:12]
