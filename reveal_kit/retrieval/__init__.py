"""Embedders (text and frame) and the vector index the memories search."""
