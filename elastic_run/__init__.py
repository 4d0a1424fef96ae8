"""elastic-run: an elastic launcher for PyTorch distributed training.

Importing the package is cheap: torch is imported only by the parts that need it, so
``elastic-run --help`` answers at once.
"""

__version__ = "0.1.0"

__all__ = ["__version__"]
