"""The device mesh, how chains sit on it (padding, placement, ``shard_map``),
several processes, and chains that see each other (collectives).
"""
