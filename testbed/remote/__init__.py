"""Remote: machines over SSH. The inventory (which machine plays which topology host), the SSH sessions (host
keys checked, commands as quoted argument lists), the per-machine shaping plan (hostshape) and the agent each
machine runs. May import: util .. run (topology and plan for the paths, shaping and probe for what the agent does
on its machine). The cycle that drives them lives in `playbooks/`.
"""
