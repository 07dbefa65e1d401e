"""Data: shipped datasets, synthetic tasks, the byte-level LM corpus, recipes.

Nothing here downloads: `datasets` reads data that ships inside installed
packages (scikit-learn's digits), `language_modeling` reads Python's own
`pydoc_data` text, and `synthetic` generates its tasks.
"""

from keras_posenc.data import datasets, language_modeling, recipes, synthetic

__all__ = ["datasets", "language_modeling", "recipes", "synthetic"]
