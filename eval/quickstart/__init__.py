"""The quickstart pipeline (see pipeline.py)."""
