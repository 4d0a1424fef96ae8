"""The dynamic rendezvous handler: one node's place in the job's rounds.

Owns ``DynamicRendezvousHandler`` (``handler.py``), joining rounds on the store (``rounds.py``),
a forming round's coordinator duties (``coordinator.py``), what a member knows of its round
(``round_state.py``) with its epoch and closed reads shared by a process's nodes (``shared_reads.py``), the look before a worker failure counts (``failure_look.py``), a round's end told to its
members by whoever decides it (``round_tell.py``), and the read-only and best-effort sides used by ``status`` and the
agent's telemetry (``status_reader.py``, ``telemetry.py``).

May import: ``rendezvous.protocol``, ``rendezvous.liveness``, the seam (``rendezvous.backend``),
the API, errors (and ``rendezvous.outage``) and settings, and the top-level ``clock``. Never a concrete backend, never the agent.
"""
