"""Pools that come with worker-core: solo (inline)."""
