"""Backends: make a plan real (netns, Mininet), run commands on its nodes, remove exactly what was made.

Also owns the kernel's namespace plumbing (`nsfs`), what the kernel can do (`capabilities`), private Open
vSwitch daemons and the stock-kernel tier under QEMU (`vm`). The registry of backends is `registry`.
May import: util, topology, plan, state.
"""
