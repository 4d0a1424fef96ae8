"""torch.distributed.elastic's public modules, mirrored module for module and name for name.

``sed s/torch.distributed.elastic/elastic_run.elastic/`` is the whole switch for Python code:
``elastic_run.elastic.rendezvous.dynamic_rendezvous``, ``elastic_run.elastic.agent.server.api``,
``elastic_run.elastic.timer``, ``elastic_run.elastic.multiprocessing.errors``, ... hold torch's
names. Every module here is a thin re-export of elastic-run's real classes (under
``elastic_run.agent``, ``elastic_run.rendezvous``, ``elastic_run.elastic.timer``, ...), never a copy;
the few names of torch left out, and why, are in the README ("Python API").

May import any public module of elastic-run; nothing imports this package. Package modules
resolve their names on first use (``lazy_names``), so importing them stays cheap; a leaf module
imports what it re-exports, as torch's does.
"""
