"""Transports that come with worker-core: embedded (no server needed)."""
