"""Screens of the dashboard: main, A/B, help."""
