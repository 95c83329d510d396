"""irbis.kernels."""
