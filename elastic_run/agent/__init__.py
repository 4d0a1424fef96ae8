"""The elastic agent: one per node, from rendezvous to exit code.

Read the layout as the design:

- ``api.py``, ``config.py``, ``events.py``: the public shapes (torch's names), the frozen launch
  configuration, the events every state change emits;
- ``local.py``: ``LocalElasticAgent``, the run loop with subprocess workers on this node;
- ``loop/``: the run loop itself (the pure state machine, its executor, the exit barrier, the
  snapshot views read);
- ``workers/``: worker processes, their environment, output, error files and failures;
- ``warm/``: warm starts (the zygote);
- ``progress/``: progress beats, hang verdicts, stragglers, a script's end, stacks;
- ``watchdog/``: the file-timer watchdog;
- ``health/``: the health-check server;
- ``link_check/``: the link check after a round forms (a helper process per node times the
  links between the nodes and names a slow one).

Imports flow one way: ``cli -> agent -> rendezvous``; the agent knows nothing of click or rich.
"""
