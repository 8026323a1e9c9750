"""The package version, in one place (read by the build and by ``run``'s attrs)."""

__version__ = "0.1.0"
