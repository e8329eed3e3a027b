"""edgepress: compress a trained BERT-family text classifier for devices, with gates between every stage."""

__version__ = "0.1.0"
