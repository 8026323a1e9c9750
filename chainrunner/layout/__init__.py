"""The device mesh, how chains sit on it (padding, placement, ``shard_map``), several
processes, chains that see each other (collectives), and ``chain_map``.
"""
