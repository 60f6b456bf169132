"""Results in the embedded SQLite file."""


class EmbeddedBackend:
    pass
