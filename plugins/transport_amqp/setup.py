from setuptools import Extension, setup

# The metadata is in setup.cfg. The extension is optional: without a compiler the package
# installs all the same and uses its Python version (worker_transport_amqp.delivery).
setup(ext_modules=[Extension("worker_transport_amqp._speedups",
                             ["src/worker_transport_amqp/_speedups.c"], optional=True)])
