# Two commands do everything on a fresh clone (only Python >= 3.11 and make needed):
#   make demo   -- create .venv, install, run the main job on a built-in example
#   make test   -- create .venv, install with test extras, run the test suite (CI runs the same;
#                  tests marked slow -- the largest benchmark, Ray on all nine, big HF models --
#                  are left to `make test-all`)
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test test-all clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	touch $(STAMP)

demo: $(STAMP)
	$(PY) -m mirage_py demo

test: $(STAMP)
	$(PY) -m pytest -q -m "not slow" tests

test-all: $(STAMP)
	$(PY) -m pytest -q tests

clean:
	rm -rf $(VENV) build *.egg-info
