"""The agent's rules: every verdict it reaches, each a pure function of observations and ``now``.

One concept per module, one line each in ``registry.py`` (the order the state machine asks them
in): ``stop.py`` (a signal), ``closed.py`` (the job closed, a failed join), ``outcome.py`` (the
workers failed or succeeded: report, restart, fail, finish), ``membership.py`` (this node's
liveness, the round ended, nodes waiting), the rules on progress beats in ``progress/``
(hung, a script's end outlived, stragglers, no progress), and the rules on nodes in ``nodes/``
(a bad node excluded, from the job's fault history). ``observation.py`` holds the frozen
records the loop's parts return each turn, ``actions.py`` what the loop does next.

No clock, thread, process, store or I/O here. May import: ``agent.api`` (the worker states),
``agent.loop.snapshot`` (the pictures the views show), ``agent.progress.stack_report`` (where a
worker's stacks say it is) and ``agent.workers.failures`` (the failure records, as types).
"""
