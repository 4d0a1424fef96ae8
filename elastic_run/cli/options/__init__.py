"""The run command's options: the settings table's rows as click options, their sources, and the
frozen LaunchConfig.

Owns the click options generated from the settings table (``run_options.py``; the table itself is
:mod:`elastic_run.agent.settings.table`), where each setting's value comes from (``sources.py``:
command line, ``PET_*``, torch's variables, Slurm, default), argparse's habits
(``torchrun_flags.py``), ``--rdzv-conf`` (``rdzv_conf.py``), the rendezvous options of ``status``
and ``close`` (``rdzv_options.py``), the entrypoint check (``entrypoint.py``), the warm-start
default (``warm_default.py``), the LaunchConfig built from all of them (``launch_config.py``) and
the docs' flag reference generated from the table (``reference.py`` -> ``docs/cli.md``). May
import: ``cli.slurm``, the agent's settings and config objects, the rendezvous's config objects.
Never rich.
"""
