"""irbis.ml."""
