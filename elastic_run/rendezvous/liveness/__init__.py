"""Liveness: heartbeats, death notices and the ring each member watches.

Owns one node's liveness turns (``turns.py``), the threads that run them (``pool.py``), death
notices in milliseconds (``peerwatch.py``, ``notices.py``, ``notice_loop.py``), and the sending
of a round's end to its other members over the same ports (``notice_send.py``).

May import: ``rendezvous.protocol``, the seam (``rendezvous.backend``), the API, errors (and
``rendezvous.outage``), settings, and the top-level ``descriptors`` and ``clock``. Never the
handler, a concrete backend or the agent.
"""
