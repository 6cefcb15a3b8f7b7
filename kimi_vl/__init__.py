"""Kimi VL suite."""
