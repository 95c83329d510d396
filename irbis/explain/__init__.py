"""irbis.explain."""
