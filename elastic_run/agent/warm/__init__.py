"""Warm starts: a per-node zygote with torch imported forks the workers.

Owns the policy of which workers start warm (``policy.py``), the agent's side of the zygote
(``zygote.py``) and the zygote process itself (``zygote_process.py``, run by path, so it
imports only the standard library and what it preloads; a forked worker, before its script,
imports the top-level ``exit_guard`` and ``auto_progress``).

May import: ``agent.workers`` (env, processes: the worker's command and start) and the
top-level ``errors``, ``parent_death``, ``exit_guard`` and ``auto_progress``. Nothing of the run
loop, the rendezvous or the CLI.
"""
