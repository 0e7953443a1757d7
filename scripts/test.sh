#!/usr/bin/env bash
# The whole test suite from a clean clone: makes .venv, installs everything, runs pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e '.[test,spark]'
# Spark needs a Java runtime, and the Java client tests run their program as a source file,
# which needs the JDK's compiler; install one if the machine has none (Debian/Ubuntu).
if ! command -v javac >/dev/null 2>&1; then
  if command -v apt-get >/dev/null 2>&1; then
    echo "test.sh: installing Java 17 for the Spark and Java client tests (apt-get install openjdk-17-jdk-headless)" >&2
    apt-get update -qq && apt-get install -y -qq openjdk-17-jdk-headless >/dev/null
  else
    echo "Java 17 is required for the Spark tests" >&2; exit 1
  fi
fi
# The Java client tests (tests/integration/test_clients_java.py) use RabbitMQ's Java client as
# Debian packages it.
if [ ! -f /usr/share/java/amqp-client.jar ]; then
  if command -v apt-get >/dev/null 2>&1; then
    echo "test.sh: installing RabbitMQ's Java client for its tests (apt-get install librabbitmq-client-java)" >&2
    apt-get update -qq && apt-get install -y -qq librabbitmq-client-java >/dev/null
  else
    echo "RabbitMQ's Java client (/usr/share/java/amqp-client.jar) is required for its tests" >&2; exit 1
  fi
fi
# The Go client tests (tests/integration/test_clients_go.py) build against RabbitMQ's Go client
# as Debian packages it, with Debian's Go.
if ! command -v go >/dev/null 2>&1 || [ ! -d /usr/share/gocode/src/github.com/rabbitmq/amqp091-go ]; then
  if command -v apt-get >/dev/null 2>&1; then
    echo "test.sh: installing Go and RabbitMQ's Go client for its tests" \
         "(apt-get install golang-go golang-github-rabbitmq-amqp091-go-dev)" >&2
    apt-get update -qq && apt-get install -y -qq golang-go golang-github-rabbitmq-amqp091-go-dev >/dev/null
  else
    echo "Go and RabbitMQ's Go client are required for their tests" >&2; exit 1
  fi
fi
# The amqplib tests (tests/integration/test_clients_node.py) run Node.js's amqplib at the version
# its package-lock.json pins.
if ! command -v npm >/dev/null 2>&1; then
  if command -v apt-get >/dev/null 2>&1; then
    echo "test.sh: installing Node.js for the amqplib tests (apt-get install nodejs npm)" >&2
    apt-get update -qq && apt-get install -y -qq nodejs npm >/dev/null
  else
    echo "Node.js and npm are required for the amqplib tests" >&2; exit 1
  fi
fi
npm ci --prefix tests/clients/node --no-audit --no-fund --loglevel=error >/dev/null
# kombu's and py-amqp's own integration suites (tests/integration/test_third_party_suites.py),
# from the source distributions of the versions installed above.
mkdir -p .venv/third-party
for project in kombu amqp; do
  version=$(.venv/bin/python -c "import importlib.metadata as m; print(m.version('$project'))")
  if [ ! -d ".venv/third-party/$project-$version/t/integration" ]; then
    .venv/bin/python -m pip download -q --no-deps --no-binary :all: -d .venv/third-party "$project==$version"
    tar -xzf ".venv/third-party/$project-$version.tar.gz" -C .venv/third-party
  fi
done
# The report test and the web console's end-to-end tests (Playwright) render pages in headless
# Chromium, Debian's (never `playwright install`, which downloads a browser); install it the same way.
if ! command -v chromium >/dev/null 2>&1 && ! command -v chromium-browser >/dev/null 2>&1; then
  if command -v apt-get >/dev/null 2>&1; then
    echo "test.sh: installing Chromium for the report page and web console tests (apt-get install chromium)" >&2
    apt-get update -qq && apt-get install -y -qq chromium >/dev/null
  else
    echo "Chromium is required for the report page and web console tests" >&2; exit 1
  fi
fi
# The web console's Firefox test drives Debian's Firefox over WebDriver BiDi, which it serves
# itself (no driver, no browser download).
if ! command -v firefox-esr >/dev/null 2>&1 && ! command -v firefox >/dev/null 2>&1; then
  if command -v apt-get >/dev/null 2>&1; then
    echo "test.sh: installing Firefox for the web console's Firefox test (apt-get install firefox-esr)" >&2
    apt-get update -qq && apt-get install -y -qq firefox-esr >/dev/null
  else
    echo "Firefox is required for the web console's Firefox test" >&2; exit 1
  fi
fi
# The cluster tests (tests/cluster, CL1-CL4) start their own JetStream servers from Debian's
# nats-server; install it the same way (they never use a NATS already running on 4222).
if [ ! -x /usr/sbin/nats-server ] && ! command -v nats-server >/dev/null 2>&1; then
  if command -v apt-get >/dev/null 2>&1; then
    echo "test.sh: installing nats-server for the cluster tests (apt-get install nats-server)" >&2
    apt-get update -qq && apt-get install -y -qq nats-server >/dev/null
  else
    echo "nats-server is required for the cluster tests" >&2; exit 1
  fi
fi
# The differential management tests compare with RabbitMQ's own management API (port 15672):
# enable its plugin when the machine's RabbitMQ runs without it.
# This changes the machine's RabbitMQ (the plugin stays enabled after the run): say so.
if command -v rabbitmq-plugins >/dev/null 2>&1 && ! (exec 3<>/dev/tcp/127.0.0.1/15672) 2>/dev/null; then
  echo "test.sh: enabling RabbitMQ's management plugin (rabbitmq-plugins enable rabbitmq_management):" \
       "the differential management tests compare with it on 127.0.0.1:15672; it stays enabled;" \
       "undo with 'rabbitmq-plugins disable rabbitmq_management'" >&2
  rabbitmq-plugins enable rabbitmq_management >/dev/null
  for _ in $(seq 60); do
    (exec 3<>/dev/tcp/127.0.0.1/15672) 2>/dev/null && break
    sleep 1
  done
fi
.venv/bin/ruff check semantics gateway spark
.venv/bin/mypy semantics gateway spark
exec .venv/bin/python -m pytest -q -p no:cacheprovider "$@"
