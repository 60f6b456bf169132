"""The consumer: taking messages from the broker and handing them to the pool."""
