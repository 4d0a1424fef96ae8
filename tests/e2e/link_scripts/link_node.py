"""One node of a link check, as an agent would run it after a round formed (issue 37, point 6).

    link_node.py --rank R --world N --hosts A,B,C --mode warn [--host-store | --store-port P]

Node 0 (``--host-store``) hosts the round's TCPStore on its own address, port 0, and prints
``store-port P`` first; the others connect to it. Each runs ``run_link_check`` over gloo, judges
the report with ``link_verdict`` and prints, as the agent's warnings would read, one
``WARNING link check: node ...`` line per slow node, then ``report {json}``. Node 0 keeps the
store until every node said it is done. Exit 0, or 1 with the check's one error line.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from datetime import timedelta

from elastic_run.agent.link_check import (
    LinkCheckError,
    link_verdict,
    parse_link_check_mode,
    run_link_check,
    slow_message,
)

FACTOR = 1.5


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--world", type=int, required=True)
    parser.add_argument("--hosts", required=True)
    parser.add_argument("--mode", default="warn")
    parser.add_argument("--host-store", action="store_true")
    parser.add_argument("--store-port", type=int, default=0)
    parser.add_argument("--size-bytes", type=int, default=1 << 20)
    parser.add_argument("--timeout-s", type=float, default=120.0)
    args = parser.parse_args()
    hosts = args.hosts.split(",")
    mode = parse_link_check_mode(args.mode)

    from torch.distributed import TCPStore

    me = hosts[args.rank]
    if args.host_store:
        store = TCPStore(me, 0, is_master=True, wait_for_workers=False)
        print(f"store-port {store.port}", flush=True)
        port = int(store.port)
    else:
        port = args.store_port
        store = TCPStore(hosts[0], port, is_master=False, timeout=timedelta(seconds=60))
    try:
        report = run_link_check(
            args.rank, args.world, hosts[0], port, "link-check/1/0", "gloo",
            args.size_bytes, args.timeout_s, factor=FACTOR,
        )  # fmt: skip
    except LinkCheckError as exc:
        print(f"Error: {exc}", flush=True)
        return 1
    finally:
        store.set(f"done/{args.rank}", "1")
    verdict = link_verdict(report, mode, FACTOR, spares_waiting=0)
    for rank in verdict.named:
        print(f"WARNING {slow_message(report, rank, hosts[rank])}", flush=True)
    print("report " + json.dumps(asdict(report)), flush=True)
    if args.host_store:
        store.wait([f"done/{r}" for r in range(args.world)], timedelta(seconds=120))
    return 0


if __name__ == "__main__":
    sys.exit(main())
