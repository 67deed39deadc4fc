"""Routing filters (``router.parts.Filter``), one per module, registered in
``router.registry``."""
