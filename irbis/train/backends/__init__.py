"""irbis.train.backends."""
