"""The etcd v3 backend and everything etcd: client, leases, watches, store, server.

Owns ``EtcdRendezvousBackend`` (``backend.py``), the typed client over pyetcd (``client.py``,
``connection.py``, ``errors.py``, ``kv.py``, ``counter.py``, ``watch.py``, ``lease.py``; the lease
keeper and the watches are shared by the clients of a process and cluster),
torch's ``EtcdStore`` (``store.py``), ``EtcdServer`` (``server.py``, a local etcd for tests,
demos and ``elastic-run etcd``), calls held by a leader that is gone (``leader_watch.py``) and
gRPC's fork handlers (``grpc_fork.py``). Only this package imports pyetcd or grpc. May import:
the seam, the API, errors (the rendezvous's and the top-level ``errors``), settings, endpoints,
the top-level ``parent_death`` (the etcd ``server.py`` starts dies with its parent) and
``rendezvous.owned_dir`` (its temporary data folder, reclaimed once its owner is gone).
"""
