"""The disabled result backend: stores nothing."""


class DisabledBackend:
    pass
