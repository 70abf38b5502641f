"""Deploy: bring testbeds up and down (topology -> plan -> backend -> shaper, undone on any failure or
signal), find a running one, change its links at run time. May import: everything below (util .. shaping).
"""
