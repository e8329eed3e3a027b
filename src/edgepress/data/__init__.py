"""Data: the embedded demo set and user sources, seeded splits, tokenization, metrics."""

from edgepress.data.config import DEMO_SOURCE, DataConfig, SplitConfig
from edgepress.data.dataset import DataSplits, TextSet
from edgepress.data.load import load_data

__all__ = ["DEMO_SOURCE", "DataConfig", "DataSplits", "SplitConfig", "TextSet", "load_data"]
