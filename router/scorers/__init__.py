"""Routing scorers (``router.parts.Scorer``), one per module, registered in
``router.registry``."""
