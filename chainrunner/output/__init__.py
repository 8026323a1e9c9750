"""What a run returns and keeps: ``Trace``, ArviZ conversion, diagnostics and
checkpoints.
"""
