"""Redis broker and result backend for worker."""

__all__: list[str] = []
