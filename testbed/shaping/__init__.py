"""Shaping: make each OTN direction deliver its delay, rate and zero loss (netem, or HTB + the NFQUEUE delay
line), calibrate the emulator's own latency, report health and drops. `registry` picks a shaper.

Kept import-light: the delay daemon (`python -m testbed.shaping.delayline`) loads only `nfqueue` with it.
May import: util, plan, state, backends, probe.
"""
