"""Recipes that build the embedded profiles: data generators, training, evaluation."""
