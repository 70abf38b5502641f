"""State: the file that records what a testbed created (before it is created), so teardown removes exactly that.

Owns `TestbedState` and its typed records (processes, shaper, Mininet switches). May import: util, plan.
"""
