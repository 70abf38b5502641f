"""Check: compare a running testbed with its plan (routes, reachability, per-direction delay, goodput, drops,
shaper health), describe what is up (`status`), and probe the machine (`doctor`).
May import: util .. deploy.
"""
