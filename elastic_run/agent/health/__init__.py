"""The health-check server: whether the agent loop and the watchdog are alive, over HTTP.

Owns the routes (``server.py``: ``/healthz``, ``/status``, ``/metrics``, torch's
``HealthCheckServer`` names), the bounded HTTP/1.0 server under them (``bounded_http.py``) and
the agent's Prometheus metrics (``metrics.py``: an event sink the loop feeds, and the snapshot).
It only reads the snapshot the loop publishes; it never emits, publishes or judges. May import
the top-level ``descriptors`` and ``errors``, the event record (``agent.events``) and the
snapshot's types (``agent.loop.snapshot``), nothing else of elastic-run (none of the loop's
logic).
"""
