"""Routing pickers (``router.parts.Picker``), one per module, registered in
``router.registry``."""
