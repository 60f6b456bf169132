"""Settings for ``--config apps.extra_config`` (the app reads them with config_from_object)."""

task_default_queue = "from-config"
