"""irbis.spark."""
