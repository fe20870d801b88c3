"""sparsetorch's version: one place (setup.py reads it too; the tuning cache file keys its entries on it)."""
__version__ = "0.1.0"
