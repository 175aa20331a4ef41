"""Datasets, normalisation and federated splits."""

from leakgym.data.spec import DatasetSpec

__all__ = ["DatasetSpec"]
