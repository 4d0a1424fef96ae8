"""Progress beats as one part of the agent: beats in, evidence and pictures out, verdicts applied.

The watchers beside their rules (the rules are pure, in ``agent/rules/progress/``):
``hang_watch.py`` (beats in, each worker's silence, stacks for the silent ones),
``hang_picture.py`` (every node's stuck ranks merged into one view), ``script_end_watch.py``
(when a script is over while its process lives), ``stack_report.py`` (py-spy's stacks read)
with ``stacks.py`` (taking them). ``config.py`` holds the run's fixed settings, ``duties.py``
the part the run loop asks each turn (one ``ProgressView``) and whose effects it applies,
``publisher.py`` the thread that publishes progress for ``status`` and reads the job's step
times.

The pure modules import no clock, thread, process or store. May import: ``agent.loop``'s
snapshot (what the loop publishes), ``agent.rules`` (the observation records, the actions, the
progress rules' models), ``agent.workers`` (failures, processes, the worker group's stop),
``rendezvous.dynamic``'s telemetry and ``rendezvous.errors``, ``worker.beat_file`` and
``worker.auto_progress``, and ``elastic_run`` itself (its path: library frames apart from the
script's). Never the CLI.
"""
