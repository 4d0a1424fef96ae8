"""The run command's options: torchrun's flags, their values, and the frozen LaunchConfig.

Owns the option table (``run_options.py``), argparse's habits (``torchrun_flags.py``), each
flag's value parsing (``values.py``), ``--rdzv-conf`` (``rdzv_conf.py``), the rendezvous options
of ``status`` and ``close`` (``rdzv_options.py``), the entrypoint check (``entrypoint.py``), the
warm-start default (``warm_default.py``) and the LaunchConfig built from all of them
(``launch_config.py``). May import: ``cli.slurm``, the agent's and the rendezvous's config
objects. Never rich.
"""
