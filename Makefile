# Set-up commands for a fresh machine. Each creates the virtualenv it needs.
#   make demo   run a worker on the embedded transport (no server) and watch tasks complete
#   make test   run the whole test suite (needs Redis, RabbitMQ and PostgreSQL on localhost), and the
#               Django tests again on Django 6 (a second virtualenv, of Python 3.12)
#   make docs   build the documentation site into site/ (mkdocs --strict)
#   make bench  every benchmark in bench/, side by side with Celery (and Dramatiq on RabbitMQ)
#   make bench-django  the Django tasks benchmark alone (its own virtualenv, Django 6)

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
DISTRIBUTIONS := -e ./core[test] -e ./plugins/pool_prefork -e ./plugins/pool_threads \
                 -e ./plugins/transport_redis -e ./plugins/transport_amqp -e ./plugins/autoscale_backlog \
                 -e ./plugins/celery_app -e ./plugins/metrics_prometheus -e ./plugins/pool_asyncio[uvloop] \
                 -e ./plugins/transport_postgres[test] -e ./plugins/beat -e ./plugins/transport_redis_cluster \
                 -e ./plugins/otel -e ./plugins/django

.PHONY: venv demo docs test test-fast test-stock test-django6 bench bench-django lint

# (the C extension is compiled when its distribution is installed: a changed source reinstalls)
$(BIN)/.installed: core/setup.cfg plugins/*/setup.cfg plugins/transport_amqp/src/worker_transport_amqp/_speedups.c
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --disable-pip-version-check -q --upgrade pip
	$(BIN)/pip install --disable-pip-version-check -q $(DISTRIBUTIONS)
	touch $@

venv: $(BIN)/.installed

# The demo needs only what it runs: worker-core and the prefork pool, no test tools.
$(BIN)/.demo-installed: core/setup.cfg plugins/pool_prefork/setup.cfg
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --disable-pip-version-check -q -e ./core -e ./plugins/pool_prefork
	touch $@

demo: $(BIN)/.demo-installed
	$(BIN)/python examples/demo.py

# The documentation site: MkDocs with the Material theme and mkdocstrings, built with --strict
# (a broken link, anchor, included file or API reference fails the build).
$(BIN)/.docs-installed: $(BIN)/.installed docs/requirements.txt
	$(BIN)/pip install --disable-pip-version-check -q -r docs/requirements.txt
	touch $@

docs: $(BIN)/.docs-installed
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

# The whole suite first; then the broker tests on the libraries' own paths and the Django 6 runs
# side by side (both wait on brokers and worker processes more than on the CPU; --output-sync
# prints each one's output whole when it ends).
test: test-fast
	$(MAKE) --no-print-directory -j2 --output-sync=target test-stock test-django6

# pytest-xdist: most tests wait on worker processes and brokers rather than on the CPU, so more
# pytest processes than cores pay off; each gets a redis-server and a RabbitMQ virtual host of its
# own (tests/conftest.py), and --dist loadscope keeps a module's tests (and the worker or venv its
# module-scoped fixtures start) in one process. PYTEST_PROCESSES=0 runs the suite serially.
PYTEST_PROCESSES ?= 4
PYTEST_XDIST := -n $(PYTEST_PROCESSES) --dist loadscope

test-fast: venv
	$(BIN)/python -m pytest $(PYTEST_XDIST)

# WORKER_STOCK_KOMBU=1 turns off every fast path built on kombu's, py-amqp's or redis-py's
# internals, WORKER_NO_EXTENSIONS=1 the C extension: what a worker falls back to when a library
# changed, proven with the broker tests.
STOCK_TESTS := tests/test_redis_transport.py tests/test_amqp_transport.py tests/test_amqp_decoding.py \
               tests/test_transport_contract.py tests/test_broker_faults.py tests/test_fuzz_envelopes.py \
               tests/test_fuzz_messages.py tests/test_interop_celery.py tests/test_task_api.py tests/test_tls.py \
               tests/test_warm_shutdown.py tests/test_full_broker.py

test-stock: venv
	WORKER_STOCK_KOMBU=1 WORKER_NO_EXTENSIONS=1 $(BIN)/python -m pytest $(PYTEST_XDIST) $(STOCK_TESTS)

# Django 6: django.tasks is Django's own from 6.0 on, which needs Python 3.12 (the main virtualenv
# has Django 5.2 and the django-tasks backport). A virtualenv of Python 3.12 with only what the
# Django tests need runs them once per feature release of Django 6 that worker-django declares
# (setup.cfg: Django>=5.2,<6.2): each with Django's own tests of its task backends (tests/tasks of
# that release's sdist, unpacked into the virtualenv), run against worker-django's backend by
# tests/test_django_suite.py.
PYTHON312 ?= $(firstword $(wildcard /root/.pyenv/versions/3.12*/bin/python3.12) python3.12)
VENV_DJANGO6 ?= .venv-django6
DJANGO6_RELEASES ?= 6.0 6.1
DJANGO6_DISTRIBUTIONS := -e ./core -e ./plugins/pool_prefork -e ./plugins/pool_threads -e ./plugins/transport_redis \
                         -e ./plugins/transport_amqp -e ./plugins/transport_postgres -e ./plugins/django \
                         'pytest>=8.1' 'pytest-timeout>=2.2' 'pytest-xdist>=3.5' 'psycopg[binary]>=3.1'
DJANGO6_TESTS := tests/test_django_tasks.py tests/test_django_suite.py

$(VENV_DJANGO6)/bin/.installed: core/setup.cfg plugins/*/setup.cfg plugins/transport_amqp/src/worker_transport_amqp/_speedups.c
	$(PYTHON312) -m venv $(VENV_DJANGO6)
	$(VENV_DJANGO6)/bin/pip install --disable-pip-version-check -q --upgrade pip
	$(VENV_DJANGO6)/bin/pip install --disable-pip-version-check -q $(DJANGO6_DISTRIBUTIONS)
	touch $@

test-django6: $(VENV_DJANGO6)/bin/.installed
	for release in $(DJANGO6_RELEASES); do \
	    $(VENV_DJANGO6)/bin/pip install --disable-pip-version-check -q "Django==$$release.*" || exit 1; \
	    version=$$($(VENV_DJANGO6)/bin/python -c "import django; print(django.__version__)"); \
	    source=$(VENV_DJANGO6)/django-$$version; \
	    if [ ! -d $$source/tests/tasks ]; then \
	        rm -rf $$source.download && mkdir -p $$source.download && \
	        $(VENV_DJANGO6)/bin/pip download --disable-pip-version-check -q --no-deps --no-binary :all: \
	            -d $$source.download "Django==$$version" && \
	        mkdir -p $$source && tar -xzf $$source.download/*.tar.gz -C $$source --strip-components 1 \
	            --wildcards '*/tests/tasks' && rm -rf $$source.download || exit 1; \
	    fi; \
	    echo "Django $$version (Python 3.12): $(DJANGO6_TESTS)"; \
	    DJANGO_SOURCE_TESTS=$$source/tests $(VENV_DJANGO6)/bin/python -m pytest $(PYTEST_XDIST) $(DJANGO6_TESTS) \
	        || exit 1; \
	done

REDIS_BENCH ?= redis://127.0.0.1:6379/15
AMQP_BENCH ?= amqp://guest:guest@127.0.0.1:5672//

bench: venv
	$(BIN)/pip install --disable-pip-version-check -q -e ./core[bench]
	for pool in prefork threads solo; do \
	    c=2; [ $$pool = solo ] && c=1; \
	    $(BIN)/python bench/compare.py --broker $(REDIS_BENCH) -P $$pool -c $$c --repeat 3 || exit 1; \
	    $(BIN)/python bench/compare.py --broker $(AMQP_BENCH) -P $$pool -c $$c --repeat 3 --dramatiq || exit 1; \
	done
	$(BIN)/python bench/compare.py --broker $(REDIS_BENCH) -P prefork -c 2 --repeat 3 -O fcfs
	$(BIN)/python bench/compare.py --broker $(AMQP_BENCH) -P prefork -c 2 --repeat 3 -O fcfs
	$(BIN)/python bench/compare.py --broker $(REDIS_BENCH) -P prefork -c 2 --repeat 3 --metrics
	$(BIN)/python bench/compare.py --broker $(REDIS_BENCH) -P prefork -c 2 --repeat 3 --otel
	$(BIN)/python bench/health_probe.py --broker $(REDIS_BENCH) --repeat 10
	for pool in prefork threads; do \
	    $(BIN)/python bench/rpc_results.py --broker $(REDIS_BENCH) -P $$pool -c 2 --repeat 3 || exit 1; \
	    $(BIN)/python bench/rpc_results.py --broker $(AMQP_BENCH) -P $$pool -c 2 --repeat 3 || exit 1; \
	done
	$(BIN)/python bench/canvas.py --broker $(REDIS_BENCH) -P prefork -c 2 --repeat 3
	$(BIN)/python bench/canvas.py --broker $(AMQP_BENCH) --backend $(REDIS_BENCH) -P prefork -c 2 --repeat 3
	$(BIN)/python bench/canvas_floor.py --broker $(REDIS_BENCH) --repeat 5
	$(BIN)/python bench/graph_resolution.py
	$(BIN)/python bench/steps_graph.py
	$(BIN)/python bench/autoscale.py --broker $(REDIS_BENCH)
	$(BIN)/python bench/amqp_ceiling.py --broker $(AMQP_BENCH)
	$(BIN)/python bench/pauses.py --broker $(AMQP_BENCH) -P prefork -c 2 --repeat 3
	$(BIN)/python bench/pauses.py --broker $(AMQP_BENCH) -P solo -c 1 --repeat 3
	$(BIN)/python bench/import_floor.py
	$(BIN)/python bench/celery_project.py --broker $(REDIS_BENCH) --results $(REDIS_BENCH)
	$(BIN)/python bench/celery_project.py --broker $(AMQP_BENCH) --results $(REDIS_BENCH)
	$(BIN)/python bench/celery_project_floor.py --broker $(AMQP_BENCH) --results $(REDIS_BENCH)
	$(BIN)/python bench/eta_memory.py --broker $(REDIS_BENCH)
	$(BIN)/python bench/eta_memory.py --broker $(AMQP_BENCH)
	$(BIN)/python bench/beat.py --broker $(REDIS_BENCH) --takeovers 5 --entries 10000
	$(BIN)/python bench/beat.py --broker $(AMQP_BENCH) --takeovers 5 --entries 0
	$(MAKE) bench-django

# The Django tasks benchmark (bench/django_tasks.py) on Django 6, in a virtualenv of its own: the
# peers it runs beside this worker (django-tasks-db, django-tasks-celery with Celery) are
# benchmark-only, in no virtualenv the tests use.
$(VENV_DJANGO6)-bench/bin/.installed: core/setup.cfg plugins/*/setup.cfg
	$(PYTHON312) -m venv $(VENV_DJANGO6)-bench
	$(VENV_DJANGO6)-bench/bin/pip install --disable-pip-version-check -q --upgrade pip
	$(VENV_DJANGO6)-bench/bin/pip install --disable-pip-version-check -q $(DJANGO6_DISTRIBUTIONS) \
	    "Django==6.1.*" "django-tasks-db>=0.13" "django-tasks-celery[celery]>=0.1" "celery[redis]>=5.4"
	touch $@

bench-django: $(VENV_DJANGO6)-bench/bin/.installed
	$(VENV_DJANGO6)-bench/bin/python bench/django_tasks.py --redis $(REDIS_BENCH) --repeat 3

lint: venv
	$(BIN)/ruff check core plugins tests bench examples docs
	$(BIN)/mypy core/src plugins/pool_prefork/src plugins/pool_threads/src \
	    plugins/transport_redis/src plugins/transport_amqp/src plugins/autoscale_backlog/src \
	    plugins/celery_app/src plugins/metrics_prometheus/src plugins/pool_asyncio/src \
	    plugins/transport_postgres/src plugins/beat/src plugins/transport_redis_cluster/src \
	    plugins/otel/src plugins/django/src
