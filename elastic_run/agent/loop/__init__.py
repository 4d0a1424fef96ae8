"""The run loop: one node's agent from rendezvous to exit code, observe -> decide -> apply.

Owns ``SimpleElasticAgent`` (``simple.py``: the one owner of the loop's state, which asks its
parts for this turn's records, decides and applies) and what it uses: what it asks of its parts
and their defaults (``parts.py``: the worker group, progress), the rendezvous as a part
(``rendezvous_part.py``), this node's fault history (``node_ledger.py``), the decisions over the rule registry (``state_machine.py``), the exit
barrier (``exit_barrier.py``, on a narrow ``RoundExit`` the loop hands it), the rank arithmetic
of a completed round (``ranks.py``), how signals reach the loop (``signals.py``), the immutable
snapshot the loop publishes for views (``snapshot.py``) and the pure goodput account the loop
folds its events and beats into (``goodput.py``).

May import: ``elastic_run.agent`` (api, config, events, the settings table for the keyword
defaults), ``agent.rules`` (the observation
records, the actions, the registry), ``agent.workers.failures``, the rendezvous's API and errors
(``rendezvous.api``, ``rendezvous.errors``, ``rendezvous.outage``), the telemetry seam (``rendezvous.dynamic.telemetry``:
the fault records) and the top-level ``errors``, ``metrics`` and
``torch_events`` (the metrics and events torch's agent records). Never
``agent.progress`` (it reads the loop's snapshot, so the loop must not read it), never the CLI,
click or rich.
"""
