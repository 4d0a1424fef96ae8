"""The start-up hook of cold Python workers: elastic-run's ``sitecustomize``.

This folder is put first on a cold worker's ``PYTHONPATH`` (only when automatic progress beats are
on, see :mod:`elastic_run.worker.auto_progress`) and holds one module Python imports at start-up,
``sitecustomize.py``. It takes itself off ``sys.path`` and out of ``PYTHONPATH`` before the
script runs, chains to the environment's own ``sitecustomize``, and arms the optimizer hooks. It
imports only the standard library and :mod:`elastic_run.worker.auto_progress`.
"""
