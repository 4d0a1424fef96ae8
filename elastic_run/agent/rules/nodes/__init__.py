"""The rules on nodes: which node is to blame, from the job's fault history. Pure.

``history.py`` is the model: the failures charged to one node (a small versioned record each
node keeps of itself and publishes in the store), read back with every field checked (a forged
or garbage record is ignored, never trusted). ``excluded.py`` is the node verdict: a node whose
own failures single it out (``--max-node-failures`` failed rounds, with different ranks, none
of them a failure that followed its rank to another node) leaves the job.

No clock, thread, process, store or I/O here. May import: ``agent.rules`` (the observation and
the actions) and ``agent.api`` (the worker states).
"""
