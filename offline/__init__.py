"""Offline evaluation: what runs without a live gateway or replica (the cluster simulator)."""
