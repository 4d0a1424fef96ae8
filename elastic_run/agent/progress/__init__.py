"""Progress beats and what the agent judges from them: hangs, stragglers, a script's end.

Pure rules beside their watchers: ``hang.py`` (the hang verdict) with ``hang_watch.py`` (beats
in, verdicts and stacks out) and ``hang_picture.py`` (every node's stuck ranks merged into one
view), ``script_end.py`` (when a script is over) with
``script_end_watch.py``, ``stragglers.py`` (step times, the slow ranks), ``stack_report.py``
(py-spy's stacks read) with ``stacks.py`` (taking them). ``config.py`` holds the run's fixed
settings, ``duties.py`` what the local agent does with beats each tick, ``publisher.py`` the
thread that publishes progress for ``status``.

The pure modules import no clock, thread, process or store. May import: ``agent.loop``'s
snapshot and state machine (what the loop publishes, the decisions the duties feed),
``agent.workers`` (failures, processes), ``rendezvous.dynamic``'s telemetry and
``rendezvous.errors``, the top-level ``beat_file`` and ``auto_progress``, and ``elastic_run``
itself (its path: library frames apart from the script's). Never the CLI.
"""
