"""Irbis: deep networks as first-class stages of Apache Spark ML pipelines."""
__version__ = "0.1.0"
