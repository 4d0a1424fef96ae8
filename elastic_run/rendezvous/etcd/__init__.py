"""The etcd v3 backend and everything etcd: client, leases, watches, store, server.

Owns ``EtcdRendezvousBackend`` (``backend.py``), the typed client over pyetcd (``client.py``,
``connection.py``, ``errors.py``, ``kv.py``, ``counter.py``, ``watch.py``, ``lease.py``),
torch's ``EtcdStore`` (``store.py``), ``EtcdServer`` (``server.py``, a local etcd for tests,
demos and ``elastic-run etcd``) and gRPC's fork handlers (``grpc_fork.py``). Only this package
imports pyetcd or grpc. May import: the seam, the API, errors, ``rendezvous.protocol``'s keys.
"""
