"""The package version, importable without the package's lazy attribute table."""

from __future__ import annotations

__all__ = ["__version__"]

__version__ = "0.1.0"
