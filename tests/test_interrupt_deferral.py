"""Signals inside a step that must happen whole (testbed/util/interrupts.py): the first one waits for the step
to end and is raised then; during teardown a second one is only acknowledged."""

from __future__ import annotations

import os
import signal

import pytest

from testbed.util.interrupts import Interrupted, cleanup, unwinding


def test_a_first_signal_inside_a_whole_step_is_raised_when_the_step_ends() -> None:
    done = []
    with pytest.raises(Interrupted) as err, unwinding():
        with cleanup():
            os.kill(os.getpid(), signal.SIGTERM)       # delivered here: acknowledged, the step goes on
            done.append("step finished")
        done.append("after the step")                  # never reached: the signal is raised at the step's end
    assert done == ["step finished"] and err.value.exit_code == 143


def test_a_second_signal_during_teardown_does_not_cut_it_short() -> None:
    done = []
    with pytest.raises(Interrupted) as err, unwinding():
        try:
            os.kill(os.getpid(), signal.SIGINT)         # the first: raised where the program is
        finally:
            with cleanup():
                os.kill(os.getpid(), signal.SIGTERM)   # the second, mid-teardown: acknowledged only
                done.append("teardown finished")
    assert done == ["teardown finished"] and err.value.exit_code == 130
