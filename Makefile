# Two commands:  make worker   (set up, then run the worker)
#                make test     (set up, then run the tests)
PYTHON ?= python3.11
VENV   ?= .venv
BIN    := $(VENV)/bin

.PHONY: setup worker test bench clean

$(BIN)/.installed: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV) || python3 -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[test]'
	touch $@

setup: $(BIN)/.installed

worker: setup
	$(BIN)/python worker.py

test: setup
	$(BIN)/python -m pytest -q

bench: setup
	$(BIN)/python bench/turn_latency.py

clean:
	rm -rf $(VENV) .turnkeeper build *.egg-info
