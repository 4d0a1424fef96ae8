"""The agent's and the launcher's settings: one table, one row a setting.

Owns the table (``table.py``: every flag of ``elastic-run run`` and every torch variable the
launcher reads, with its ``PET_`` variable, kind, bounds, default, help and the places its value
goes), what a row is (``setting.py``: :class:`Setting`, its kinds of value, its places), the
value parsers the rows name (``values.py``) and the stream values of ``--redirects``/``--tee``
(``streams.py``). The click options, ``--print-config``, the docs' flag reference, the agent's
keyword defaults and the hand-over of values to ``WorkerSpec``, ``LocalElasticAgent``,
``AgentOptions`` and ``ProgressOptions`` are all generated from the table.

May import: ``agent.node_check.options`` and ``agent.link_check.mode`` (their parsers), ``agent.progress.config`` and the progress rules' parsers (``agent.rules.progress``:
beats, script_end; the progress settings' defaults live in ``ProgressOptions``), the
rendezvous's settings (``rendezvous.settings``: one set of bounds) and the top-level ``errors``.
Never click, rich or the CLI; nothing here reads the environment.
"""
