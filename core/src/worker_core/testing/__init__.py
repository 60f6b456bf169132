"""Test helpers shipped with the core, for the project's tests and for third-party plugins.

- :mod:`.pool_contract`: the checks every pool must pass (``pool_contract.run_all(MyPool)``);
- :mod:`.transport_contract`: the checks every transport must pass against a real broker
  (``transport_contract.run_all(MyTransport, "mybroker://host:port/")``);
- :mod:`.result_backend_contract`: the checks every result backend must pass against a real
  store (``result_backend_contract.run_all(MyBackend, "mydb://host/0")``);
- :mod:`.lease_contract`: the checks every transport that elects leaders must pass against a
  real broker (``lease_contract.run_all(MyTransport, "mybroker://host:port/")``);
- :class:`PoolRunner`: drive a pool directly or on a kombu hub, as the worker's loops do;
- :class:`JobProbe`: record the callbacks of one job;
- :mod:`.jobs`: picklable job targets for pool tests.
"""

from . import jobs, lease_contract, pool_contract, result_backend_contract, transport_contract
from .runner import JobProbe, PoolRunner

__all__ = ["JobProbe", "PoolRunner", "jobs", "lease_contract", "pool_contract", "result_backend_contract",
           "transport_contract"]
