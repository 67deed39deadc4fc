"""The discrete-event cluster simulator behind ``foldgate simulate``."""
