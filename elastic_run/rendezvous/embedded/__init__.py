"""The embedded etcd cluster: a static etcd cluster run by the agents of the listed hosts.

``--rdzv-backend embedded-etcd --rdzv-endpoint h1,h2,h3``: the agent on each listed host starts
one etcd member of a static cluster of those hosts, and every agent, listed or not, uses the
members exactly as the ``etcd`` backend uses an etcd it was given. No service to run, and no
single point of failure: the job survives the loss of a minority of the member hosts.

Owns the cluster's spec (``cluster.py``: which hosts, which ports, which one is this host), the
member process and its keeper (``member.py``, ``keeper.py``: etcd dies with its agent, even on
SIGKILL, and its data directory with it), the quorum watch (``quorum.py``: the members that died,
and when the rendezvous lost its quorum for good) and the backend (``backend.py``: the etcd
backend on the members' client URLs, which keeps this host's member up until the job ends).
May import: the API, errors (the rendezvous's and the top-level ``errors``), settings,
endpoints, ``rendezvous.protocol``'s keys, ``rendezvous.etcd`` and ``rendezvous.owned_dir``
(the member's data folder); ``keeper.py`` imports nothing of elastic-run.
"""
