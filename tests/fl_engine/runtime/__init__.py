"""Tests of the package of the same name (`tests/__init__.py`)."""
