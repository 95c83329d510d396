"""The module path under which ``ImageFeaturizer`` was saved before it moved to
:mod:`irbis.ml.image_featurizer`; kept so that those saved stages and pipelines still load."""

from irbis.ml.image_featurizer import ImageFeaturizer

__all__ = ["ImageFeaturizer"]
