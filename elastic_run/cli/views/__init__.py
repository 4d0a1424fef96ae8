"""What people see: the live panel, plain event lines, the status and failure views.

Owns the live panel (``live_panel.py``), the event lines and status tables (``lines.py``) and
the progress table (``progress_view.py``). Views read snapshots and records; they never own
state, emit events, publish to a store or call into the loop's logic.
"""
