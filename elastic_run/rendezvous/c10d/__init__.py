"""The c10d backend: the rendezvous seam on a TCPStore (or FileStore), the embedded default.

Owns ``C10dRendezvousBackend`` (``backend.py``), the link to the store host with its read
deadlines (``link.py``), the typed store calls (``store.py``), the short-call links a
process's many nodes share (``short_links.py``) and the hosting process's descriptor budget
(``descriptors.py``). May import: the seam, the
API, errors (the rendezvous's and the top-level ``errors``), settings, endpoints,
``rendezvous.protocol``'s keys and records, and torch's public store classes.
"""
