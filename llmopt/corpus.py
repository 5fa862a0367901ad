"""The default text for workloads, calibration and evaluation: real English that every Python install
ships (the pydoc topics), so nothing needs downloading."""

from __future__ import annotations


def default_text() -> str:
    from pydoc_data.topics import topics

    return "\n".join(topics[k] for k in sorted(topics))
