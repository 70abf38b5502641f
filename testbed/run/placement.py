"""Which hosts run the pipeline's stages, in stage order.

`spread` (the default): the stages spread evenly over the DCs in DC order (earlier DCs take the remainder),
so without `--stages` there is one stage per DC and every OTN link between consecutive DCs is crossed.
`fill`: the first N hosts in DC order (without `--stages`, every host), so a few stages may all sit in
one or two DCs."""

from __future__ import annotations

from collections.abc import Sequence

from testbed.errors import TestbedError

PLACEMENTS = ("spread", "fill")


class PlacementError(TestbedError, ValueError):
    """The stages cannot be placed as asked; the message says what would work."""


def place_stages(hosts: Sequence[tuple[str, str]], stages: int | None, placement: str = "spread") -> list[int]:
    """Indices into `hosts` ((name, dc) pairs in DC order) of the hosts that run stage 0, 1, ..."""
    if placement not in PLACEMENTS:
        raise PlacementError(f"placement {placement!r}: choose {' or '.join(PLACEMENTS)}")
    dcs: dict[str, list[int]] = {}
    for i, (_, dc) in enumerate(hosts):
        dcs.setdefault(dc, []).append(i)
    count = stages if stages is not None else (len(dcs) if placement == "spread" else len(hosts))
    if not 2 <= count <= len(hosts):
        raise PlacementError(f"{count} stages: the testbed has {len(hosts)} hosts in {len(dcs)} DCs; use --stages "
                             f"2..{len(hosts)}")
    if placement == "fill":
        return list(range(count))
    taken: list[int] = []
    queues = [list(v) for v in dcs.values()]
    while len(taken) < count:
        for queue in queues:
            if queue and len(taken) < count:
                taken.append(queue.pop(0))
    return sorted(taken)
