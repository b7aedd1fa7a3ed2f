"""torchrun, with its rendezvous store listening only where it must: `python -m retool_cli.rl.torchrun ADDR PORT
HOST START -- TORCHRUN_ARGS`.

torchrun's static rendezvous makes node 0's agent host a c10d TCP store that every process of the run joins,
and a TCPStore server binds to all of the machine's interfaces, unauthenticated. Here the store is opened first,
on a socket bound to ADDR alone (127.0.0.1 for a run on one node; trainer.master_addr's address on node 0 of
several), and torchrun's own store of the same port shares it (TCPStore's multi_tenant servers are looked up by
port within a process) instead of binding another. PORT 0 picks a free port (one node); HOST=0 (the nodes after
the first) opens nothing. START=fork: the trainer's modules are imported here once, before torchrun forks its
ranks from this process (rl/rank.py; TORCHRUN_ARGS then run that file); START=exec: each rank is a fresh
interpreter. The rest is torchrun as it is.
"""

from __future__ import annotations

import datetime
import socket
import sys

from retool_cli import stops


def serve_store(addr: str, port: int) -> tuple[object, socket.socket]:
    """A TCPStore server on a socket bound to `addr`:`port` only (port 0: a free one); keep both alive."""
    family, kind, proto, _, address = socket.getaddrinfo(addr, port, type=socket.SOCK_STREAM)[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(address)
    sock.listen(1024)
    from torch.distributed import TCPStore

    store = TCPStore(
        addr,
        sock.getsockname()[1],
        None,
        True,
        datetime.timedelta(seconds=300),
        wait_for_workers=False,
        multi_tenant=True,
        master_listen_fd=sock.fileno(),
    )
    return store, sock


def main(argv: list[str]) -> None:
    addr, port, host, start = argv[0], int(argv[1]), argv[2] == "1", argv[3]
    torchrun_args = argv[argv.index("--") + 1 :]
    stops.die_with_parent()  # the launcher gone (even by SIGKILL): torchrun stops its ranks
    if start == "fork":
        from retool_cli.rl.rank import preload

        preload()
    kept = None
    if host:
        kept = serve_store(addr, port)
        port = kept[1].getsockname()[1]
    from torch.distributed.run import main as torchrun

    torchrun([f"--master_addr={addr}", f"--master_port={port}", *torchrun_args])
    del kept


if __name__ == "__main__":
    main(sys.argv[1:])
