"""The command line: ``run`` (the default), ``status``, ``close``, ``etcd``, and the views."""
