"""The embedded registry (profiles/ in the repository, zenedge.profiles when installed)."""
