"""The single place the version lives (hatch reads it for the wheel)."""

__version__ = "0.1.0"
