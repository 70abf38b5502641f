"""CPU steal has one definition, shared by the single machine's monitor and the remote cycle."""

from __future__ import annotations

import pytest

from testbed.util.hostload import steal_fraction


def test_steal_is_of_the_first_eight_fields_guest_time_already_counted_in_user() -> None:
    before = [100, 0, 50, 800, 0, 0, 10, 40, 30, 0]           # user nice system idle iowait irq softirq steal guest gn
    after = [200, 0, 100, 1600, 0, 0, 20, 80, 90, 0]          # guest +60 is inside user's +100
    assert steal_fraction(before, after) == pytest.approx(40 / (100 + 50 + 800 + 10 + 40))


def test_no_time_passed_or_no_steal_field_is_no_steal() -> None:
    assert steal_fraction([1, 2, 3, 4], [1, 2, 3, 4]) == 0.0
    assert steal_fraction([1, 2, 3, 4], [5, 6, 7, 8]) == 0.0
