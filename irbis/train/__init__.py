"""irbis.train."""
