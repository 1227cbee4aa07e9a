"""Merge math for the pool: similarity, OPCM (dense and low-rank), baseline merge methods.

Pure tensor-in, tensor-out: nothing here knows about the store, files or models.
"""
