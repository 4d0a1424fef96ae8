"""Warm starts: a per-node zygote with torch imported forks the workers.

Owns the policy of which workers start warm (``policy.py``), the agent's side of the zygote
(``zygote.py``) and the zygote process itself (``zygote_process.py``, run by path, so it
imports only the standard library and what it preloads).

May import: ``agent.workers`` (the worker's command and output plumbing) and the top-level
helpers. Nothing of the run loop, the rendezvous or the CLI.
"""
