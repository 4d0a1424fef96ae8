"""The goodput part of ``elastic-run status``: one line, the job's training share and lost time.

Shows the picture ``status`` built (:func:`elastic_run.cli.status_pictures.goodput_picture`: the
nodes' published accounts, merged); it computes nothing.
"""

from __future__ import annotations

from typing import Any

from rich.text import Text

__all__ = ["GoodputPicture", "render_goodput"]

GoodputPicture = dict[str, Any]


def render_goodput(picture: GoodputPicture | None) -> Text | None:
    """One line for the status table (None: nothing published)."""
    if picture is None or picture.get("job") is None:
        return None
    return Text.assemble(("goodput ", "dim"), str(picture.get("summary", "")))
