"""The default autoscaler."""


class DemandAutoscaler:
    pass
