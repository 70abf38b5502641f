"""The `testbed` command line: doctor, plan, up, down, status, exec, verify."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence

from testbed import lifecycle, table, units
from testbed.backends import BACKENDS, BackendError
from testbed.paths import DEFAULT_TOPOLOGY, resolve_topology
from testbed.plan import Plan, build_plan
from testbed.state import list_states
from testbed.topology import TopologyError, load_topology


def _print_plan(plan: Plan) -> None:
    print(f"testbed {plan.testbed}  (topology {plan.topology}, {plan.source})")
    rows = [(n.name, n.dc, n.role, n.netns, " ".join(n.addresses)) for n in plan.nodes]
    print(table.render(["node", "dc", "role", "netns", "addresses"], rows, "\nNodes"))
    rows = [(s.link, f"{s.src_dc} -> {s.dst_dc}", units.format_time(s.delay_s), units.format_rate(s.rate_bps),
             units.format_time(s.jitter_s), f"{s.loss:g}", "yes" if s.lossless else "no", s.mtu,
             units.format_size(s.bdp_bytes), s.rate_queue_packets, s.delay_queue_packets) for s in plan.shapes]
    print(table.render(["link", "direction", "delay", "rate", "jitter", "loss", "lossless", "mtu", "BDP(rtt)",
                        "rate q (pkts)", "delay q (pkts)"], rows, "\nOTN links (one row per direction)"))
    rows = [(n.name, str(r.dst), str(r.gateway), r.dev) for n in plan.nodes if n.role == "router" for r in n.routes]
    print(table.render(["router", "destination", "via", "dev"], rows, "\nRoutes (shortest one-way delay)"))
    rows = [(src, dst, " > ".join(p)) for src, by in plan.paths.items() for dst, p in by.items() if src != dst]
    print(table.render(["from", "to", "path"], rows, "\nDC paths"))
    print(f"\nTCP buffers (tcp_rmem/tcp_wmem max on hosts): {units.format_size(plan.tcp_buffer_bytes)} "
          "(2 x the largest path bandwidth-delay product, at least 6 MiB)")
    for note in plan.notes:
        print(f"scale: {note}")


def cmd_plan(args: argparse.Namespace) -> int:
    plan = build_plan(load_topology(resolve_topology(args.topology)), args.name)
    if args.json:
        print(json.dumps(plan.to_json(), indent=1))
    else:
        _print_plan(plan)
    return 0


def cmd_up(args: argparse.Namespace) -> int:
    result = lifecycle.up(resolve_topology(args.topology), args.name, args.backend)
    plan = result.plan
    print(f"testbed {plan.testbed} up: {len(plan.nodes)} namespaces ({len(plan.hosts)} hosts), "
          f"{len(plan.veths)} veth pairs, in {result.seconds:.2f} s ({args.backend} backend)")
    if not args.no_verify:
        from testbed.verify import verify_basic
        report = verify_basic(plan.to_json())
        bad = report.failures()
        n_reach = sum(1 for c in report.checks if c.kind == "reach")
        print(f"verify: {len(report.checks) - len(bad)}/{len(report.checks)} checks passed "
              f"({n_reach} host pairs pinged, routes read back)")
        if bad:
            for c in bad[:10]:
                print(f"  FAIL {c.kind} {c.subject}: expected {c.expected}, measured {c.measured}", file=sys.stderr)
            print(f"testbed: verification failed; the testbed stays up for inspection "
                  f"('testbed down {plan.testbed}' removes it)", file=sys.stderr)
            return 1
    print(f"next: testbed status {plan.testbed} | testbed exec {plan.hosts[0].name} -- ip addr | "
          f"testbed down {plan.testbed}")
    return 0


def cmd_down(args: argparse.Namespace) -> int:
    names = [s.name for s in list_states()] if args.all else [lifecycle.resolve_name(args.name)]
    if args.all and not names:
        print("no testbed is up")
    for name in names:
        seconds = lifecycle.down(name)
        print(f"testbed {name} down in {seconds:.2f} s")
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    from testbed.status import describe
    states = [s for s in list_states() if args.name in (None, s.name)]
    if args.name and not states:
        raise BackendError(f"no testbed named {args.name!r} is up")
    records = [describe(s) for s in states]
    if args.json:
        print(json.dumps(records if not args.name else records[0], indent=1))
        return 0
    if not records:
        print("no testbed is up")
    for rec in records:
        print(f"testbed {rec['name']}: {rec['phase']}, {rec['health']} ({rec['backend']}, {rec['topology']})")
        rows = [(n["name"], n["dc"], n["role"], n["netns"], " ".join(n["addresses"]),
                 "yes" if n["present"] else "GONE") for n in rec["nodes"]]
        print(table.render(["node", "dc", "role", "netns", "addresses", "present"], rows))
        rows = [(lk["link"], f"{lk['from']} -> {lk['to']}", units.format_time(lk["delay_s"]),
                 units.format_rate(lk["rate_bps"])) for lk in rec["links"]]
        print(table.render(["link", "direction", "one-way delay", "rate"], rows, "\nOTN links (configured)"))
    return 0


def cmd_exec(args: argparse.Namespace) -> int:
    argv = args.command
    if not argv:
        raise BackendError("no command given; write: testbed exec NODE -- CMD [ARGS...]")
    backend = lifecycle.find_node(args.node, args.name)
    try:
        return backend.exec(args.node, argv).returncode
    except FileNotFoundError:
        raise BackendError(f"command not found: {argv[0]}") from None


def cmd_verify(args: argparse.Namespace) -> int:
    from testbed.verify import verify_basic
    backend = lifecycle.open_backend(args.name)
    report = verify_basic(backend.state.plan)
    if args.json:
        print(json.dumps({"testbed": report.testbed, "ok": report.ok,
                          "checks": [_check_dict(c) for c in report.checks]},
                         indent=1))
    else:
        rows = [(c.kind, c.subject, c.expected, c.measured, "pass" if c.ok else "FAIL") for c in report.checks
                if args.all or not c.ok or c.kind != "reach"]
        print(table.render(["check", "subject", "expected", "measured", "result"], rows, f"verify {report.testbed}"))
        n_reach = sum(1 for c in report.checks if c.kind == "reach")
        print(f"\n{len(report.checks) - len(report.failures())}/{len(report.checks)} checks passed "
              f"({n_reach} host pairs; --all lists each)")
    if not report.ok:
        print(f"testbed: {len(report.failures())} check(s) failed", file=sys.stderr)
        return 1
    return 0


def _check_dict(check: object) -> dict:
    return {k: getattr(check, k) for k in ("kind", "subject", "expected", "measured", "ok")}


def cmd_doctor(args: argparse.Namespace) -> int:
    from testbed.doctor import run_doctor
    report = run_doctor()
    if args.json:
        print(json.dumps(report.to_json(), indent=1))
        return 0
    print(f"kernel {report.kernel}, {report.cpus} CPUs")
    rows = [(p.name, "yes" if p.ok else "no", p.detail) for p in report.probes]
    print(table.render(["capability", "present", "evidence"], rows))
    d = report.decision
    print(f"\nA run here uses: backend={d.backend} shaper={d.shaper} transport={d.transport} rdma={d.rdma}")
    for reason in d.reasons:
        print(f"  - {reason}")
    return 0 if d.backend != "none" else 1


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="testbed", description=__doc__)
    sub = parser.add_subparsers(dest="cmd", required=True, metavar="COMMAND")

    p = sub.add_parser("doctor", help="probe what this kernel and machine offer")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_doctor)

    p = sub.add_parser("plan", help="print the plan of a topology (addresses, routes, link shapes, queues)")
    p.add_argument("topology", nargs="?", default=DEFAULT_TOPOLOGY, help="file or shipped name (topologies/)")
    p.add_argument("--name", help="testbed name (default: the topology's name)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_plan)

    p = sub.add_parser("up", help="bring a topology up")
    p.add_argument("topology", nargs="?", default=DEFAULT_TOPOLOGY)
    p.add_argument("--name", help="testbed name (default: the topology's name); lets several coexist")
    p.add_argument("--backend", default="netns", choices=sorted(BACKENDS))
    p.add_argument("--no-verify", action="store_true", help="skip the reachability and route check after bring-up")
    p.set_defaults(func=cmd_up)

    p = sub.add_parser("down", help="remove a testbed and everything it created")
    p.add_argument("name", nargs="?")
    p.add_argument("--all", action="store_true", help="every testbed this tool has up")
    p.set_defaults(func=cmd_down)

    p = sub.add_parser("status", help="list running testbeds, their nodes and links")
    p.add_argument("name", nargs="?")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_status)

    p = sub.add_parser("exec", help="run a command in a node's namespace: testbed exec NODE -- CMD...")
    p.add_argument("node")
    p.add_argument("--name", help="testbed (when several have this node)")
    p.add_argument("command", nargs="*", help="the command, after --")
    p.set_defaults(func=cmd_exec)

    p = sub.add_parser("verify", help="check a running testbed against its plan")
    p.add_argument("name", nargs="?")
    p.add_argument("--json", action="store_true")
    p.add_argument("--all", action="store_true", help="list every check, not only failures and routes")
    p.set_defaults(func=cmd_verify)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    tail: list[str] | None = None
    if "exec" in argv and "--" in argv and argv.index("exec") < argv.index("--"):
        argv, tail = argv[:argv.index("--")], argv[argv.index("--") + 1:]
    args = build_parser().parse_args(argv)
    if tail is not None:
        args.command = tail
    needs_root = args.cmd in ("up", "down", "exec", "verify")
    try:
        if needs_root and os.geteuid() != 0:
            raise BackendError(f"'testbed {args.cmd}' needs root (network namespaces); run it with sudo")
        return int(args.func(args))
    except TopologyError as exc:
        n = len(exc.problems)
        print(f"testbed: invalid topology {exc.source} ({n} problem{'s' if n != 1 else ''})", file=sys.stderr)
        for problem in exc.problems:
            print(f"  {problem.render(exc.source)}", file=sys.stderr)
        return 2
    except BackendError as exc:
        print(f"testbed: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("testbed: interrupted; everything created by this command was removed", file=sys.stderr)
        return 130
    except lifecycle.Interrupted as exc:
        print(f"testbed: {exc}; everything created by this command was removed", file=sys.stderr)
        return 143
