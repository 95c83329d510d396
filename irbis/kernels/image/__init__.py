"""Images as pure numpy: decoding, operations, preprocessing for a network, augmentation.

* :mod:`~irbis.kernels.image.header`: image dimensions read from a file header, before decoding;
* :mod:`~irbis.kernels.image.decode`: decoding and Spark's image struct;
* :mod:`~irbis.kernels.image.ops`: the operations (resize, crop, flip, ...) over ``(H, W, C)`` arrays;
* :mod:`~irbis.kernels.image.op_chain`: a JSON list of operations applied in one pass;
* :mod:`~irbis.kernels.image.network_input`: images to a network's input batch, as a model's preprocessing says;
* :mod:`~irbis.kernels.image.batch`: the batch bodies of the image stages;
* :mod:`~irbis.kernels.image.augment`: training-time augmentation, drawn per image from a seeded generator.

Pure: no pyspark.
"""
