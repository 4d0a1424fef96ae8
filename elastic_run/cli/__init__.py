"""The command line: ``run`` (the default), ``status``, ``close``, ``etcd``.

``main.py`` is the command group, ``run.py`` turns a LaunchConfig into the library's objects,
``status.py`` reads or closes a job, ``etcd_cmd.py`` runs a local etcd; ``options/`` parses the
flags once into frozen config, ``slurm/`` reads an allocation, ``views/`` draws what people see.
The only package that imports click or rich.
"""

# First thing, before click and the rest load: the launcher's start (the goodput account's).
from elastic_run.cli import launch_clock as _launch_clock  # noqa: E402, F401
