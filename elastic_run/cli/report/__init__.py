"""``elastic-run report``: one page (and a terminal summary) of what happened to a job.

Owns reading every node's ``events.jsonl`` from the log directories (``read.py``: the only
module here that touches files), parsing its lines (``events_file.py``), booking each node's
phases as the goodput account books them (``phases.py``: it replays the account's own fold),
aligning the nodes' clocks by the rounds they share (``clocks.py``), the markers and verdicts
(``markers.py``), the drawn rows at any scale (``rows.py``: lanes grouped, outliers kept
apart), the report assembled from all that (``build.py``), and its three renderings: the
self-contained HTML page (``html_page.py``), the rich terminal summary (``terminal.py``) and
the click command with ``--json`` (``command.py``). The shapes are frozen dataclasses
(``model.py``); everything but ``read.py`` and ``command.py`` is pure.

May import: the goodput account (``agent.loop.goodput``) and the top-level ``errors``; click
and rich in the renderers and the command only.
"""
