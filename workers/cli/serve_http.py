"""packyard http: git's smart HTTP (pushes into packyard, fetches through git's upload-pack) for a frontend proxy."""
from __future__ import annotations

import argparse
import ipaddress
import sys

#: seconds a stopping server waits for the stdio pushes it is running
DRAIN_SECONDS = 30.0


def _listen(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise argparse.ArgumentTypeError(f"--listen wants HOST:PORT, got {value!r}")
    return host.strip("[]") or "127.0.0.1", int(port)


def register(subparsers) -> None:  # type: ignore[no-untyped-def]
    p = subparsers.add_parser(
        "http", help="serve git's smart HTTP (push and fetch) for a frontend proxy, on loopback",
        description="Serve GET /<storage>/<path>/info/refs?service=git-receive-pack|git-upload-pack and POST "
                    "/<storage>/<path>/git-receive-pack|git-upload-pack as git's http-backend does (gzip and "
                    "chunked request bodies). No authentication: the frontend in front of it does that, so it "
                    "listens on loopback unless --allow-remote. Port 0 picks a free port; the address is "
                    "printed on stdout once listening. See docs/receive.md.")
    p.add_argument("--listen", type=_listen, default=("127.0.0.1", 8417), metavar="HOST:PORT",
                   help="address to listen on (default 127.0.0.1:8417)")
    p.add_argument("--allow-remote", action="store_true",
                   help="allow a non-loopback --listen address (anyone who reaches it can push)")
    p.set_defaults(func=run, logs=True)


def run(args: argparse.Namespace) -> int:
    from packyard.workers.cli.prepare import prepare_embedded
    from packyard.workers.receive.smarthttp import GitHttp, serve_forever
    from packyard.workers.settings import get_settings

    host, port = args.listen
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if not loopback and not args.allow_remote:
        print(f"packyard http: {host} is not a loopback address; the frontend authenticates, so pass "
              "--allow-remote to serve it anyway", file=sys.stderr)
        return 2
    s = get_settings()
    prepare_embedded(s)
    handoff = None
    refused = ""
    if s.receive_socket is not None:   # stdio pushes (`packyard receive-pack`) handed to this process
        import logging

        from packyard.workers.receive.handoff import HandoffServer

        handoff = HandoffServer(s.receive_socket, logging.getLogger("packyard.http"))
        if handoff.bind():
            handoff.serve_in_thread()
        else:
            refused, handoff = handoff.refused, None

    def ready(h: str, p: int) -> None:
        print(f"listening on http://{h}:{p}/", flush=True)
        if handoff is not None:
            print(f"taking stdio pushes on unix:{handoff.path}", flush=True)
        elif s.receive_socket is not None:
            print(f"not taking stdio pushes on unix:{s.receive_socket}: {refused}", flush=True)

    import signal

    def stop(_signum: int, _frame: object) -> None:   # a service manager's stop: the same as Ctrl-C
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    try:
        serve_forever(host, port, GitHttp(s), ready=ready)
    except KeyboardInterrupt:
        return 0
    finally:
        if handoff is not None:   # no new stdio pushes; those running may finish (bounded)
            left = handoff.close(drain=DRAIN_SECONDS)
            if left:
                print(f"packyard http: {left} stdio pushes still running after {DRAIN_SECONDS:g} s were cut off",
                      file=sys.stderr)
    return 0
