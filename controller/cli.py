"""``inagg-controller`` (serve) and ``inaggctl`` (operate).

``inaggctl`` needs only the job service's client, which a worker's install has
(``pip install inagg[torch]``): the control plane's modules (P4Runtime, the switch) are imported
by ``inagg-controller`` alone, when it runs."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import signal
import sys

from inagg.controller.top import recirculation_lines
from inagg.hostlib import add_version_flag

from inagg.hostlib.jobservice.client import ControllerClient, ControllerError
from inagg.hostlib.jobservice.credentials import ADMIN_TOKEN_ENV, ADMIN_TOKEN_FILE_ENV, CA_ENV, INSECURE_ENV, load_token


_STOP_SIGNALS = {signal.SIGTERM, signal.SIGINT}


def controller_main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="inagg-controller", description="Serve the inagg job service "
                                "and program the switches named in the config file.")
    add_version_flag(p)
    p.add_argument("--config", required=True, help="controller config (JSON)")
    p.add_argument("--listen", help="override the config's listen address")
    p.add_argument("--metrics-listen", metavar="IP:PORT",
                   help="serve Prometheus metrics here (overrides the config's metrics_listen)")
    p.add_argument("--insecure", action="store_true",
                   help="serve TCP in plaintext (job and admin tokens readable on the wire)")
    p.add_argument("-v", "--verbose", action="store_true")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    # SIGTERM/SIGINT blocked in this thread, and so in every thread started from it (gRPC's):
    # only the wait below takes them. A handler would run on the main thread only once its wait
    # wakes, which a signal the kernel hands to another thread never makes it do.
    signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)
    from inagg.controller.config import load_config           # the control plane: inagg[control]
    from inagg.controller.controller import Controller
    from inagg.controller.service import serve
    from inagg.controller.switch import SwitchError
    try:
        config = load_config(args.config)
        if args.insecure:
            config = dataclasses.replace(config, insecure=True)
        listen = args.listen or config.listen
        ctl = Controller(config)
        server = serve(ctl, listen)
        metrics_listen = args.metrics_listen or config.metrics_listen
        if metrics_listen:
            from inagg.controller.metrics import serve_metrics
            metrics, port = serve_metrics(ctl, metrics_listen)
            print(f"inagg-controller: metrics on http://{metrics_listen.rpartition(':')[0]}:{port}/metrics",
                  file=sys.stderr, flush=True)
    except (ValueError, SwitchError, OSError, RuntimeError) as e:
        print(f"inagg-controller: {e}", file=sys.stderr)
        return 2
    print(f"inagg-controller serving on {listen}: {len(config.switches)} switch(es), "
          f"{len(ctl.jobs)} job(s) restored", flush=True)
    signal.sigwait(_STOP_SIGNALS)
    server.stop(grace=1)
    if metrics_listen:
        metrics.shutdown()
    ctl.close()
    return 0


def _grant_text(g) -> str:
    if not g.mode:
        return "-"
    via = " (RoCEv2)" if g.transport == "roce" else ""
    return f"{g.mode} [{g.slot_base},{g.slot_base + g.slot_count}) e{g.epoch} -> {g.aggregator}{via}"


def _positive_seconds(text: str) -> float:
    """argparse type of a refresh interval: a number of seconds above 0 (0 would poll the
    controller in a busy loop; a negative one failed in time.sleep)."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected seconds > 0, got {text!r}")
    return value


def _ctl_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="inaggctl", description="Operate an inagg controller.",
                                allow_abbrev=False)  # no --admin-token prefix of --admin-token-file
    add_version_flag(p)
    p.add_argument("--controller", default=os.environ.get("INAGG_CONTROLLER", "127.0.0.1:50051"),
                   help="controller address (default $INAGG_CONTROLLER, else 127.0.0.1:50051)")
    p.add_argument("--admin-token-file", help=f"file holding the admin token (default: ${ADMIN_TOKEN_FILE_ENV}'s "
                                              f"file, else ${ADMIN_TOKEN_ENV})")
    p.add_argument("--controller-ca", help=f"CA certificate (PEM) the controller's TLS certificate is "
                                           f"from (default: ${CA_ENV})")
    p.add_argument("--insecure", action="store_true",
                   help=f"plaintext TCP to the controller (as ${INSECURE_ENV}=1)")
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("jobs", help="jobs with mode, slots, epoch and counters")
    sub.add_parser("slots", help="the switch slot map")
    tp = sub.add_parser("top", help="live table of jobs and switch counters")
    tp.add_argument("--interval", type=_positive_seconds, default=1.0, help="seconds between refreshes")
    tp.add_argument("--once", action="store_true", help="print one table and exit")
    for name, text in (("drain", "move a job to host aggregation"), ("release", "end a job")):
        sp = sub.add_parser(name, help=text)
        sp.add_argument("job_id", type=int)
    return p


def _connect(args: argparse.Namespace) -> tuple[str, ControllerClient]:
    """The admin token (from a file or the environment) and a client of the controller."""
    admin_token = load_token(args.admin_token_file or os.environ.get(ADMIN_TOKEN_FILE_ENV))
    if not admin_token:
        raise ValueError(f"no admin token: give --admin-token-file, or set ${ADMIN_TOKEN_FILE_ENV} "
                         f"or ${ADMIN_TOKEN_ENV}")
    return admin_token, ControllerClient(args.controller, ca=args.controller_ca, insecure=args.insecure or None)


def _print_jobs(listing) -> None:
    """``inaggctl jobs``: one line a job (its switch counters, and the moves its stall reports
    made), then a line per recirculating switch pipe (``top.recirculation_lines``)."""
    print(f"{'job':>5} {'name':<12} {'workers':>7}  {'active grant':<48} {'pending':<14} counters")
    for j in listing.jobs:
        pending = f"{j.pending.mode} e{j.pending.epoch}" if j.HasField("pending") else "-"
        counters = " ".join(f"{k}={v}" for k, v in sorted(j.counters.items()))
        if j.stall_moves:
            counters += f" stall_moves={j.stall_moves}"
        print(f"{j.job_id:>5} {j.name:<12} {j.joined:>3}/{j.n_workers:<3}  "
              f"{_grant_text(j.active):<48} {pending:<14} {counters}")
    for line in recirculation_lines(listing):
        print(line)


def _print_slots(listing) -> None:
    """``inaggctl slots``: the switch pool as 64 cells, each lettered by the job holding it."""
    width = 64
    cells = ["."] * width
    scale = listing.switch_slots / width if listing.switch_slots else 1
    for j in listing.jobs:
        if j.active.mode == "switch":
            for c in range(int(j.active.slot_base / scale), int((j.active.slot_base + j.active.slot_count) / scale)):
                cells[c] = chr(ord("A") + (j.job_id - 1) % 26)
    print(f"switch slots 0..{listing.switch_slots} ({scale:g} per cell): |{''.join(cells)}|")
    for j in listing.jobs:
        print(f"  {chr(ord('A') + (j.job_id - 1) % 26)} = job {j.job_id} {_grant_text(j.active)}")


def _run_command(client: ControllerClient, admin_token: str, args: argparse.Namespace) -> None:
    if args.cmd == "jobs":
        _print_jobs(client.list_jobs(admin_token))
    elif args.cmd == "slots":
        _print_slots(client.list_jobs(admin_token))
    elif args.cmd == "top":
        from inagg.controller.top import top
        try:
            top(client, admin_token, args.interval, args.once)
        except KeyboardInterrupt:
            pass
    elif args.cmd == "drain":
        g = client.drain(admin_token, args.job_id)
        print(f"job {args.job_id}: {'pending' if g.pending else 'active'} {_grant_text(g)}")
    elif args.cmd == "release":
        client.release(admin_token, args.job_id)
        print(f"job {args.job_id} released")


def ctl_main(argv: list[str] | None = None) -> int:
    args = _ctl_parser().parse_args(argv)
    try:
        admin_token, client = _connect(args)
    except (ValueError, ControllerError) as e:
        print(f"inaggctl: {e}", file=sys.stderr)
        return 2
    try:
        _run_command(client, admin_token, args)
    except ControllerError as e:
        print(f"inaggctl: {e}", file=sys.stderr)
        return 2
    finally:
        client.close()
    return 0
