"""Dashboard widgets, one module per area."""
