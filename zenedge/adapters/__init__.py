"""Adapter file formats zenedge reads and writes (torch-free validation lives here)."""
