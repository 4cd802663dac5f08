# Two commands:  make worker   (set up, then run the worker and the web page)
#                make test     (set up, then `make lint` and the tests)
PYTHON ?= python3.11
VENV   ?= .venv
BIN    := $(VENV)/bin

.PHONY: setup worker lint test bench clean

$(BIN)/.installed: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV) || python3 -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[test]'
	touch $@

# The MCP tool tests' Node server, from the committed lock (skipped without npm:
# those tests then say why they skip).
NPM_SERVERS := tests/npm/node_modules/.package-lock.json
$(NPM_SERVERS): tests/npm/package-lock.json
	@if command -v npm >/dev/null; then npm ci --prefix tests/npm --no-audit --no-fund --loglevel=error; \
	else echo "npm not found: the MCP tests that need Node's server-everything are skipped"; fi

setup: $(BIN)/.installed $(NPM_SERVERS)

# The page runs next to the worker (it waits for the dev server the worker starts),
# and with TURNKEEPER_ENCRYPTION_KEYS set the codec server for the dev server's UI;
# Ctrl-C stops them all, and they stop whenever the worker does.
worker: setup
	@$(BIN)/turnkeeper web & web=$$!; codec=; \
	if [ -n "$$TURNKEEPER_ENCRYPTION_KEYS" ]; then $(BIN)/turnkeeper codec-server & codec=$$!; fi; \
	trap 'kill $$web $$codec 2>/dev/null; wait $$web $$codec 2>/dev/null' EXIT; \
	trap 'exit 130' INT TERM; \
	$(BIN)/python worker.py

# ruff, then mypy on the package as it installs (tools/typecheck.py says why through a view).
lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/python tools/typecheck.py

# The tests mostly wait on timers and other processes: TEST_PROCESSES runs them in
# parallel (pytest-xdist), each process with its own dev server; tests of one
# xdist_group run in one process, one at a time. On 2 cores 4 beat 2 and 3.
TEST_PROCESSES ?= 4

test: lint
	$(BIN)/python -m pytest -q --durations=15 -n $(TEST_PROCESSES) --dist loadgroup

bench: setup
	$(BIN)/python bench/turn_latency.py

clean:
	rm -rf $(VENV) .turnkeeper build *.egg-info tests/npm/node_modules .mypy_view .mypy_cache
