"""Autoscalers that come with worker-core."""
