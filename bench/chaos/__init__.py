"""The soak's parts: broker and proxy, the worker under test, fault injection, the ledger of runs,
the verdict and the report (``bench/soak.py`` runs them)."""
