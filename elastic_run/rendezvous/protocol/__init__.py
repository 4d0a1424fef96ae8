"""The O(N) rendezvous protocol, pure: its decisions, records and keys.

Owns the decisions ((what was read, now) -> action, ``decisions.py``), the versioned JSON
records the protocol keeps in a store (``records.py``, never pickle), the key schema
(``keys.py``), the stable order of a new round's members (``stable_ranks.py``) and the line
that tells a round's members it ended (``round_notice.py``).

Imports no store, clock, thread or socket; may import ``elastic_run.rendezvous.errors`` and
``rendezvous.api``'s plain ``Assignment`` (what the rank decision returns) only.
"""
