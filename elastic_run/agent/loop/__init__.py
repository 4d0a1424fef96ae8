"""The run loop: one node's agent from rendezvous to exit code.

Owns ``SimpleElasticAgent`` (``simple.py``: the one owner of the loop's state, which observes,
decides and applies) and what it uses: the pure decisions (``state_machine.py``, observation ->
action, with its transition table), the exit barrier (``exit_barrier.py``, on a narrow
``RoundExit`` the loop hands it), the rank arithmetic of a
completed round (``ranks.py``), how signals reach the loop (``signals.py``), the immutable
snapshot the loop publishes for views (``snapshot.py``), the pure goodput account the loop folds
its events and beats into (``goodput.py``) and the progress hooks a subclass fills
(``progress_hooks.py``).

May import: ``elastic_run.agent`` (api, events), ``agent.workers.failures``, the rendezvous's
API and errors (``rendezvous.api``, ``rendezvous.errors``) and the top-level ``errors``. Never
``agent.progress`` (it reads the loop's snapshot, so the loop must not read it), never the CLI,
click or rich.
"""
