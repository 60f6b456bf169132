"""The worker: its runtime object and the worker blueprint's steps."""
