"""Registries of profiles (the embedded one in profiles/, or any static HTTP(S) server) and pull."""
