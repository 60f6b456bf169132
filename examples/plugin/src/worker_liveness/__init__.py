"""An example plugin for worker: a liveness-file step and a pool that times its jobs."""
