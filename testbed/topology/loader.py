"""Load and validate a topology YAML file into a frozen `Topology`.

Inheritance follows containerlab: `defaults.link` -> `datacenters.<dc>.link` (for directions leaving that
DC) -> `links[i]` -> `links[i].a_to_b` / `b_to_a`; likewise `defaults.fabric` -> `datacenters.<dc>.fabric`.
All problems are collected and raised together as one `TopologyError`.
"""

from __future__ import annotations

import difflib
import ipaddress
from pathlib import Path
from typing import Any

import yaml

from testbed.topology.background import parse_background
from testbed.topology.edge import EdgeSpec, edge_problems, resolve_edge
from testbed.topology.errors import Problem, TopologyError
from testbed.topology.model import (
    FIBRE_DELAY_S_PER_KM,
    ROUTER_SUFFIX,
    Datacenter,
    DirectionSpec,
    Fabric,
    OtnLink,
    TcpSettings,
    Topology,
)
from testbed.topology.yamlcheck import UniqueKeyLoader, YamlChecker, join_path
from testbed.util import units
from testbed.util.paths import shipped_topologies

TOP_KEYS = {"name", "description", "defaults", "datacenters", "links", "addressing", "rdma", "tcp", "background"}
TCP_KEYS = {"congestion_control", "slow_start_after_idle"}
CONGESTION_CONTROLS = ("reno", "cubic", "bbr", "dctcp", "htcp", "vegas")
RDMA_KINDS = ("none", "softroce")
RDMA_MIN_LINK_MTU = 1100
"""RoCE needs an RDMA MTU of at least 1024 plus its headers on every OTN hop."""
DEFAULT_KEYS = {"fabric", "link"}
FABRIC_KEYS = {"rate", "latency", "mtu"}
DC_KEYS = {"hosts", "fabric", "link"}
LINK_DEFAULT_KEYS = {"rate", "mtu", "lossless", "jitter", "loss", "extra_delay"}
DIRECTION_KEYS = {"rate", "delay", "extra_delay", "jitter", "loss"}
EDGE_KEYS = {"buffer", "xoff", "xon", "edge_rate"}
LINK_KEYS = {"a", "b", "distance", "distance_km", "delay", "real_rate", "a_to_b", "b_to_a"} | LINK_DEFAULT_KEYS | EDGE_KEYS
ADDRESSING_KEYS = {"base"}

BUILTIN_DEFAULTS: dict[str, dict[str, Any]] = {
    "fabric": {"rate": "10gbit", "latency": "0us"},
    "link": {"rate": "1gbit", "mtu": 1500, "lossless": True, "jitter": "0ms", "loss": 0, "extra_delay": "0ms"},
}
DEFAULT_ADDRESS_BASE = "10.100.0.0/16"
MAX_RATE_BPS = 100e9
MAX_TOPOLOGY_BYTES = 1024 * 1024


def _unreadable_fix(path: str | Path) -> str:
    """What to give instead of a topology file that cannot be read: the nearest shipped name, and the others."""
    names = [p.stem for p in shipped_topologies()]
    close = difflib.get_close_matches(Path(path).stem, names, n=1)
    return ((f"did you mean {close[0]!r}? " if close else "")
            + f"give a shipped topology ({', '.join(names)}) or the path of a topology YAML file")


def load_topology(path: str | Path) -> Topology:
    """Read and validate a topology file. Raises `TopologyError` naming the file for any problem."""
    source = str(path)
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_TOPOLOGY_BYTES + 1)
    except OSError as exc:
        raise TopologyError(source, [Problem("", f"cannot read file: {exc.strerror}", _unreadable_fix(path))]) from exc
    if len(data) > MAX_TOPOLOGY_BYTES:
        raise TopologyError(source, [Problem("", f"the file is larger than {MAX_TOPOLOGY_BYTES // 1024} KiB",
                                             "a topology is a short YAML file; is this the right path?")])
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise TopologyError(source, [Problem("", f"not UTF-8 text (byte {exc.start} is 0x{data[exc.start]:02x})",
                                             "save the file as UTF-8 text")]) from None
    return parse_topology(text, source)


def parse_topology(text: str, source: str = "<string>") -> Topology:
    """Validate topology YAML text. `source` names the file in error messages."""
    try:
        raw = yaml.load(text, Loader=UniqueKeyLoader)  # noqa: S506 - SafeLoader subclass
    except RecursionError:
        raise TopologyError(source, [Problem("", "the document is nested too deeply",
                                             "a topology nests a few levels: datacenters, links, their keys")]) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        if problem.startswith("duplicate key"):
            raise TopologyError(source, [Problem(where, problem, "remove or rename one of the two entries")]) from exc
        raise TopologyError(source, [Problem(where, f"YAML syntax error: {problem}",
                                             "fix the YAML syntax at that position")]) from exc
    check = YamlChecker()
    topology = _build(raw, check, source)
    if check.problems or topology is None:
        raise TopologyError(source, check.problems)
    return topology


def _build(raw: Any, check: YamlChecker, source: str) -> Topology | None:
    if not isinstance(raw, dict):
        check.add("", "the file is not a YAML mapping", "start with 'name:', 'datacenters:' and 'links:'")
        return None
    top = check.mapping(raw, "", TOP_KEYS)
    for required in ("name", "datacenters"):
        if required not in top:
            check.add(required, "missing required key", f"add '{required}:' at the top level")
    name = check.name(top["name"], "name", "topology") if "name" in top else None
    description = str(top.get("description", ""))

    defaults = check.mapping(top.get("defaults"), "defaults", DEFAULT_KEYS)
    fabric_default = {**BUILTIN_DEFAULTS["fabric"], **check.mapping(defaults.get("fabric"), "defaults.fabric", FABRIC_KEYS)}
    link_default = {**BUILTIN_DEFAULTS["link"], **check.mapping(defaults.get("link"), "defaults.link", LINK_DEFAULT_KEYS)}

    dcs, dc_link_defaults = _build_datacenters(top.get("datacenters"), fabric_default, check)
    links, pairs = _build_links(top.get("links"), dcs, link_default, dc_link_defaults, check)
    _check_connected(dcs, pairs, check)
    base = _build_addressing(top.get("addressing"), len(dcs), len(links), check)
    rdma = _build_rdma(top.get("rdma", "none"), links, dcs, check)
    tcp = _build_tcp(top.get("tcp"), check)
    background, problems = parse_background(top.get("background"), {h: dc.name for dc in dcs for h in dc.hosts})
    for problem in problems:
        check.add(*problem)
    if check.problems or name is None or base is None:
        return None
    return Topology(name=name, description=description, source=source, datacenters=tuple(dcs),
                    links=tuple(links), address_base=base, rdma=rdma, tcp=tcp, background=tuple(background))


def _build_tcp(raw: Any, check: YamlChecker) -> TcpSettings:
    """`tcp: {congestion_control: reno, slow_start_after_idle: false}` (both optional)."""
    spec = check.mapping(raw, "tcp", TCP_KEYS)
    default = TcpSettings()
    cc = spec.get("congestion_control", default.congestion_control)
    if cc not in CONGESTION_CONTROLS:
        check.add("tcp.congestion_control", f"unknown congestion control {cc!r}",
                  f"use one of: {', '.join(CONGESTION_CONTROLS)} (the kernel must also allow it in namespaces: "
                  "net.ipv4.tcp_allowed_congestion_control)")
        cc = default.congestion_control
    idle = spec.get("slow_start_after_idle", default.slow_start_after_idle)
    if not isinstance(idle, bool):
        check.add("tcp.slow_start_after_idle", f"expected true or false, got {idle!r}", "write true or false")
        idle = default.slow_start_after_idle
    return TcpSettings(congestion_control=str(cc), slow_start_after_idle=idle)


def _mtu(raw: Any, path: str, check: YamlChecker) -> int | None:
    """An IP MTU from 576 to 9000 (None where absent or refused)."""
    if raw is None:
        return None
    if isinstance(raw, bool) or not isinstance(raw, int) or not 576 <= raw <= 9000:
        check.add(path, f"MTU {raw!r} is out of range", "use an integer from 576 to 9000")
        return None
    return raw


def _build_rdma(raw: Any, links: list[OtnLink], dcs: list[Datacenter], check: YamlChecker) -> str:
    """`rdma: softroce` gives every host an rxe device; RoCE frames must fit every OTN link's and fabric's MTU."""
    if raw not in RDMA_KINDS:
        check.add("rdma", f"unknown RDMA kind {raw!r}", f"use one of: {', '.join(RDMA_KINDS)}")
        return "none"
    if raw == "softroce":
        for link in links:
            if link.mtu < RDMA_MIN_LINK_MTU:
                check.add(f"links[{link.index}].mtu", f"MTU {link.mtu} is too small for RoCE (rdma: softroce)",
                          f"use mtu: {RDMA_MIN_LINK_MTU} or more (9000 carries RDMA MTU 4096)")
        for dc in dcs:
            if dc.fabric.mtu is not None and dc.fabric.mtu < RDMA_MIN_LINK_MTU:
                check.add(f"datacenters.{dc.name}.fabric.mtu", f"MTU {dc.fabric.mtu} is too small for RoCE "
                          "(rdma: softroce)", f"use mtu: {RDMA_MIN_LINK_MTU} or more, or leave it out (9000)")
    return str(raw)


def _build_datacenters(raw: Any, fabric_default: dict[str, Any], check: YamlChecker
                       ) -> tuple[list[Datacenter], dict[str, dict[str, Any]]]:
    dcs: list[Datacenter] = []
    link_defaults: dict[str, dict[str, Any]] = {}
    if raw is None:
        return dcs, link_defaults
    if not isinstance(raw, dict) or not raw:
        check.add("datacenters", "expected a non-empty mapping of datacenter name to its spec",
                  "write e.g. 'datacenters: {dc-a: {hosts: 2}, dc-b: {hosts: 2}}'")
        return dcs, link_defaults
    host_owner: dict[str, str] = {}
    for dc_name, spec in raw.items():
        path = join_path("datacenters", str(dc_name))
        if check.name(dc_name, path, "datacenter") is None:
            continue
        spec = check.mapping(spec, path, DC_KEYS)
        fabric_raw = {**fabric_default, **check.mapping(spec.get("fabric"), join_path(path, "fabric"), FABRIC_KEYS)}
        rate = check.quantity(fabric_raw["rate"], join_path(path, "fabric.rate"), units.parse_rate, strict=True,
                              maximum=MAX_RATE_BPS)
        latency = check.quantity(fabric_raw["latency"], join_path(path, "fabric.latency"), units.parse_time)
        mtu = _mtu(fabric_raw.get("mtu"), join_path(path, "fabric.mtu"), check)
        hosts = _build_hosts(spec.get("hosts", 0), dc_name, join_path(path, "hosts"), host_owner, check)
        link_defaults[dc_name] = check.mapping(spec.get("link"), join_path(path, "link"), LINK_DEFAULT_KEYS)
        if rate is not None and latency is not None:
            dcs.append(Datacenter(name=dc_name, hosts=hosts, fabric=Fabric(rate_bps=rate, latency_s=latency, mtu=mtu)))
    routers = {f"{dc.name}{ROUTER_SUFFIX}" for dc in dcs}
    for host, dc_name in host_owner.items():
        if host in routers:
            check.add(join_path("datacenters", dc_name), f"host name {host!r} is taken by a datacenter's router",
                      f"rename the host; '<dc>{ROUTER_SUFFIX}' names are reserved for routers")
    if dcs and not any(dc.hosts for dc in dcs):
        check.add("datacenters", "no datacenter has any host", "give at least one datacenter 'hosts: N'")
    return dcs, link_defaults


def _build_hosts(raw: Any, dc: str, path: str, owner: dict[str, str], check: YamlChecker) -> tuple[str, ...]:
    if isinstance(raw, bool) or not isinstance(raw, (int, list)):
        check.add(path, f"expected a host count or a list of host names, got {raw!r}",
                  "write 'hosts: 2' or 'hosts: [gpu1, gpu2]'")
        return ()
    if isinstance(raw, int):
        if not 0 <= raw <= 200:
            check.add(path, f"host count {raw} is out of range", "use 0 to 200 hosts per datacenter")
            return ()
        names: list[Any] = [f"{dc}-h{i + 1}" for i in range(raw)]
    else:
        names = raw
    result: list[str] = []
    for i, host in enumerate(names):
        hpath = join_path(path, i) if isinstance(raw, list) else path
        if check.name(host, hpath, "host") is None:
            continue
        if host in owner:
            check.add(hpath, f"duplicate host {host!r} (already in datacenter {owner[host]!r})",
                      "host names must be unique across the whole topology")
            continue
        owner[host] = dc
        result.append(host)
    return tuple(result)


def _build_links(raw: Any, dcs: list[Datacenter], link_default: dict[str, Any],
                 dc_link_defaults: dict[str, dict[str, Any]], check: YamlChecker
                 ) -> tuple[list[OtnLink], list[frozenset[str]]]:
    """Links that validated, and the DC pairs of every link whose ends are valid (for the connectivity check)."""
    links: list[OtnLink] = []
    if raw is None:
        raw = []
    if not isinstance(raw, list):
        check.add("links", f"expected a list of links, got {type(raw).__name__}",
                  "write 'links:' followed by '- {a: dc-a, b: dc-b, distance: 1000km}' items")
        return links, []
    known = [dc.name for dc in dcs]
    pairs: dict[frozenset[str], int] = {}
    for i, item in enumerate(raw):
        path = join_path("links", i)
        spec = check.mapping(item, path, LINK_KEYS)
        ends = []
        for end in ("a", "b"):
            value = spec.get(end)
            if value is None:
                check.add(join_path(path, end), "missing link end", f"set '{end}:' to one of: {', '.join(known)}")
            elif value not in known:
                close = difflib.get_close_matches(str(value), known, n=1)
                hint = f"did you mean {close[0]!r}?" if close else f"use one of: {', '.join(known)}"
                check.add(join_path(path, end), f"unknown datacenter {value!r}", hint)
            else:
                ends.append(value)
        if len(ends) != 2:      # its other keys are still checked, so every problem of the file is said at once
            _build_link(i, str(spec.get("a", "?")), str(spec.get("b", "?")), spec, path, link_default, {}, check)
            continue
        a, b = ends
        if a == b:
            check.add(join_path(path, "b"), f"link joins datacenter {a!r} to itself", "a link must join two datacenters")
            continue
        pair = frozenset(ends)
        if pair in pairs:
            check.add(path, f"second link between {a!r} and {b!r} (first is links[{pairs[pair]}])",
                      "parallel links are not supported; merge them into one link with the summed rate")
            continue
        pairs[pair] = i
        link = _build_link(i, a, b, spec, path, link_default, dc_link_defaults, check)
        if link is not None:
            links.append(link)
    return links, list(pairs)


def _build_link(index: int, a: str, b: str, spec: dict[str, Any], path: str, link_default: dict[str, Any],
                dc_link_defaults: dict[str, dict[str, Any]], check: YamlChecker) -> OtnLink | None:
    distance = None
    if "distance" in spec and "distance_km" in spec:
        check.add(join_path(path, "distance_km"), "both 'distance' and 'distance_km' given", "keep one of them")
    for key in ("distance", "distance_km"):
        if key in spec:
            distance = check.quantity(spec[key], join_path(path, key), units.parse_distance_km)
    if distance is None and "delay" not in spec and not any(
            "delay" in (spec.get(d) or {}) for d in ("a_to_b", "b_to_a") if isinstance(spec.get(d), dict)):
        if not any(p.path.startswith(join_path(path, "distance")) for p in check.problems):
            check.add(path, "link has neither 'distance' nor 'delay'",
                      "add 'distance: 1000km' (5 us/km of fibre) or an explicit one-way 'delay: 5ms'")
        return None
    mtu = _mtu(spec.get("mtu", link_default["mtu"]), join_path(path, "mtu"), check)
    lossless_raw = spec.get("lossless", link_default["lossless"])
    lossless = _lossless(lossless_raw, join_path(path, "lossless"), check)
    real_rate = None
    if "real_rate" in spec:
        real_rate = check.quantity(spec["real_rate"], join_path(path, "real_rate"), units.parse_rate, strict=True)
    directions = []
    for key, src in (("a_to_b", a), ("b_to_a", b)):
        dpath = join_path(path, key)
        own = check.mapping(spec.get(key), dpath, DIRECTION_KEYS)
        merged = {**link_default, **dc_link_defaults.get(src, {}),
                  **{k: v for k, v in spec.items() if k in DIRECTION_KEYS}, **own}
        directions.append(_build_direction(merged, own, spec, dpath, path, distance, lossless != "false", check))
    if mtu is None or lossless is None or None in directions:
        return None
    edge = _build_edge(spec, lossless, path, directions, check)   # type: ignore[arg-type]
    return OtnLink(index=index, a=a, b=b, distance_km=distance, mtu=mtu, lossless=lossless != "false",
                   a_to_b=directions[0], b_to_a=directions[1], real_rate_bps=real_rate, edge=edge)


def _lossless(value: Any, path: str, check: YamlChecker) -> str | None:
    """`pfc`, `queue` (also `true`) or `false`."""
    if value is True or value == "queue":
        return "queue"
    if value is False:
        return "false"
    if value == "pfc":
        return "pfc"
    check.add(path, f"expected pfc, queue, true or false, got {value!r}",
              "write 'pfc' (finite buffer, pause), 'queue' or true (deep queue), or false (drops allowed)")
    return None


def _build_edge(spec: dict[str, Any], lossless: str, path: str, directions: list[DirectionSpec],
                check: YamlChecker) -> EdgeSpec | None:
    """The link's edge buffer; None: a plain link, or a problem reported (the file is then refused whole)."""
    given = {k: spec[k] for k in EDGE_KEYS if k in spec}
    if lossless == "queue" and set(given) - {"edge_rate"}:
        key = sorted(set(given) - {"edge_rate"})[0]
        check.add(join_path(path, key), f"'{key}' on a link with a deep queue (lossless: {spec.get('lossless', True)!r})",
                  f"set '{join_path(path, 'lossless')}: pfc' for a finite buffer with pause, or false for tail drop")
        return None
    if lossless == "false" and {"xoff", "xon"} & set(given):
        key = sorted({"xoff", "xon"} & set(given))[0]
        check.add(join_path(path, key), f"PFC threshold '{key}' on a link without PFC (lossless: false)",
                  f"set '{join_path(path, 'lossless')}: pfc', or remove '{key}'")
        return None
    if lossless != "pfc" and not given:
        return None
    sizes = {k: check.quantity(given[k], join_path(path, k), units.parse_size, strict=k == "buffer")
             for k in ("buffer", "xoff", "xon") if k in given}
    drain = (check.quantity(given["edge_rate"], join_path(path, "edge_rate"), units.parse_rate, strict=True,
                            maximum=MAX_RATE_BPS) if "edge_rate" in given else None)
    if None in sizes.values() or ("edge_rate" in given and drain is None):
        return None
    if any(d.jitter_s for d in directions):
        check.add(join_path(path, "jitter"), "jitter on a link with an edge buffer (the edge model keeps order and "
                  "has no jitter)", "remove 'jitter', or the edge keys")
        return None
    mode = {"pfc": "pfc", "queue": "queue", "false": "drop"}[lossless]
    edge = EdgeSpec(mode, sizes.get("buffer"), sizes.get("xoff"), sizes.get("xon"), drain)
    found = [problem for forward, reverse in ((directions[0], directions[1]), (directions[1], directions[0]))
             for problem in edge_problems(resolve_edge(edge, forward.rate_bps, forward.delay_s, reverse.delay_s))]
    if found:
        key, problem, fix = found[0]            # one per link: both directions usually say the same
        check.add(join_path(path, key), problem, fix)
        return None
    return edge


def _build_direction(merged: dict[str, Any], own: dict[str, Any], link_spec: dict[str, Any], dpath: str,
                     lpath: str, distance: float | None, lossless: bool, check: YamlChecker) -> DirectionSpec | None:
    def where(key: str) -> str:
        return join_path(dpath, key) if key in own else join_path(lpath, key)

    rate = check.quantity(merged["rate"], where("rate"), units.parse_rate, strict=True, maximum=MAX_RATE_BPS)
    extra = check.quantity(merged.get("extra_delay", 0), where("extra_delay"), units.parse_time)
    if "delay" in merged:
        delay = check.quantity(merged["delay"], where("delay"), units.parse_time)
    else:
        delay = None if distance is None else distance * FIBRE_DELAY_S_PER_KM
    jitter = check.quantity(merged["jitter"], where("jitter"), units.parse_time)
    loss = check.quantity(merged["loss"], where("loss"), units.parse_fraction)
    if loss is not None and loss > 1:
        check.add(where("loss"), f"loss {merged['loss']!r} is above 100 %", "give a probability like '0.1%' or 0.001")
        loss = None
    if loss and lossless:
        check.add(where("loss"), f"loss {merged['loss']!r} on a lossless link",
                  f"set '{join_path(lpath, 'lossless')}: false' for a fault experiment, or remove 'loss'")
        loss = None
    if None in (rate, extra, delay, jitter, loss):
        return None
    assert rate is not None and extra is not None and delay is not None and jitter is not None and loss is not None
    total = delay + extra
    if jitter > total:
        check.add(where("jitter"), f"jitter {merged['jitter']!r} exceeds the one-way delay {units.format_time(total)}",
                  "use a jitter at most the delay")
        return None
    if total > 1.0:
        check.add(where("delay"), f"one-way delay {units.format_time(total)} is above 1 s",
                  "give a delay in ms (a 20000 km fibre is 100 ms)")
        return None
    return DirectionSpec(delay_s=total, rate_bps=rate, jitter_s=jitter, loss=loss)


def _check_connected(dcs: list[Datacenter], pairs: list[frozenset[str]], check: YamlChecker) -> None:
    if len(dcs) < 2:
        return
    adjacency: dict[str, set[str]] = {dc.name: set() for dc in dcs}
    for pair in pairs:
        a, b = sorted(pair)
        if a in adjacency and b in adjacency:
            adjacency[a].add(b)
            adjacency[b].add(a)
    seen = {dcs[0].name}
    frontier = [dcs[0].name]
    while frontier:
        for nxt in adjacency[frontier.pop()] - seen:
            seen.add(nxt)
            frontier.append(nxt)
    cut_off = [dc.name for dc in dcs if dc.name not in seen]
    if cut_off:
        check.add("links", f"datacenter(s) {', '.join(cut_off)} not connected to {dcs[0].name}",
                  f"add a link joining {cut_off[0]} to the rest, e.g. '- {{a: {dcs[0].name}, b: {cut_off[0]}, distance: 100km}}'")


def _build_addressing(raw: Any, n_dcs: int, n_links: int, check: YamlChecker) -> ipaddress.IPv4Network | None:
    spec = check.mapping(raw, "addressing", ADDRESSING_KEYS)
    base_text = spec.get("base", DEFAULT_ADDRESS_BASE)
    try:
        base = ipaddress.IPv4Network(str(base_text))
    except ValueError as exc:
        check.add("addressing.base", f"invalid IPv4 network {base_text!r} ({exc})", "write it like 10.100.0.0/16")
        return None
    if not base.is_private:
        check.add("addressing.base", f"{base} is not a private range",
                  "use a private block such as 10.100.0.0/16; the testbed's addresses live only inside its namespaces")
        return None
    needed = n_dcs + (1 if n_links else 0)
    if base.prefixlen > 24 or 2 ** (24 - base.prefixlen) < needed or n_links > 64:
        check.add("addressing.base", f"{base} is too small for {n_dcs} datacenters and {n_links} links",
                  "use a /16 (one /24 per datacenter plus one /24 for OTN point-to-point /30s)")
        return None
    return base
