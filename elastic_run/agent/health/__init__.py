"""The health-check server: whether the agent loop and the watchdog are alive, over HTTP.

Owns the routes (``server.py``: ``/healthz``, ``/status``, ``/metrics``, torch's
``HealthCheckServer`` names) and the bounded HTTP/1.0 server under them (``bounded_http.py``).
It only reads the snapshot the loop publishes; it never emits, publishes or judges. May import
the top-level ``descriptors`` and ``errors``, nothing else of elastic-run (nothing of the loop).
"""
