"""Worker processes: what one worker is given, how it is started, watched, stopped and heard.

Owns the worker group as one part of the agent (``group.py``: an attempt's processes, and one
frozen view of them each turn, exits amended once and failures built once), the worker's command
and environment (``env.py``), process supervision with sessions, reaping and the process-tree
kill (``processes.py``), the guardian that outlives a SIGKILLed
agent (``guardian.py``), callable entrypoints (``function_workers.py`` in the agent,
``function_call.py`` in the worker), stdout/stderr plumbing (``output.py``, ``console.py``,
``logs_specs.py``), error files and the failure summary (``failures.py``), NUMA binding
(``numa.py``) and the gloo loopback check (``gloo_check.py``).

May import: ``elastic_run.agent`` (api, config), ``agent.rules.observation`` (the view it returns) and the top-level ``errors``, ``parent_death``,
``auto_progress`` (its variable), ``site_hook`` (its directory on the worker's path) and
``worker`` (``function_call.py`` runs in the worker), and ``rendezvous.owned_dir`` (the function
workers' folder, reclaimed after a SIGKILLed agent). Nothing of the run loop, the rest of the
rendezvous or the CLI.
"""
