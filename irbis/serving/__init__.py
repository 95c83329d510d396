"""irbis.serving."""
