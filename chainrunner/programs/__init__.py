"""What runs on the devices: the programs built from a kernel, their compile cache,
ensemble programs, the ``batch_size='auto'`` rule (it costs the lowered step) and JAX's
persistent compilation cache.
"""
