"""``run`` and ``sample``: the stages (plan, start, place, initialise, compile,
loop, burn-in, finish) and the host side of the chunk loop.
"""
