"""irbis.spark: Spark glue. Importing the package imports no pyspark (the ``irbis`` command's help reads
:data:`DEFAULT_MASTER` from here)."""

#: The master of :func:`irbis.spark.session.get_spark` when none is given (outside ``spark-submit``), and of the
#: ``irbis`` commands.
DEFAULT_MASTER = "local[*]"
