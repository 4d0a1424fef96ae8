"""``python -m elastic_run``: the same as the ``elastic-run`` command."""

from elastic_run.cli.main import main

if __name__ == "__main__":
    main()
