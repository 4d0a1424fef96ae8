"""``elastic-run etcd``: run a local etcd for a job and print the endpoint to pass."""

from __future__ import annotations

import sys

import click

__all__ = ["etcd_command"]


@click.command("etcd")
@click.option(
    "--data-dir",
    type=click.Path(file_okay=False),
    default=None,
    help="Where etcd keeps its data and logs (default: a temporary directory, removed at exit).",
)
@click.option("--port", type=int, default=0, show_default=True, help="Client port (0: a free one).")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option(
    "--members", type=click.IntRange(1, 7), default=1, show_default=True, help="Cluster size."
)
def etcd_command(data_dir: str | None, port: int, host: str, members: int) -> None:
    """Run etcd in the foreground until Ctrl-C, printing the --rdzv-endpoint to use."""
    from elastic_run.rendezvous.etcd.server import main_foreground

    sys.exit(main_foreground(data_dir=data_dir, port=port, host=host, members=members))
