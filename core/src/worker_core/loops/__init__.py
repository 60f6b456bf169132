"""Event loops that come with worker-core: sync (blocking drain) and async (kombu hub)."""
