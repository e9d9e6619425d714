# Two commands on a fresh machine: `make train` and `make test`. Both create .venv when it is missing and install
# the exact versions in constraints.txt (pyproject.toml itself only has lower bounds).
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
PYTEST_ARGS ?=

.PHONY: setup train test test-fast lint bench clean

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -c constraints.txt -e '.[dev,export,wds,hf]'
	touch $(STAMP)

setup: $(STAMP)

# --quiet: after train.py's one-sentence error the launcher exits 1 instead of adding its own traceback; all four
# launch values given, so Accelerate prints no 'values were not passed' warning either.
train: $(STAMP)
	$(VENV)/bin/accelerate launch --quiet --num_processes 1 --num_machines 1 --mixed_precision no --dynamo_backend no train.py $(ARGS)

test: $(STAMP)
	$(PY) -m pytest -q $(PYTEST_ARGS)

test-fast: $(STAMP)
	$(PY) -m pytest -q -m "not slow" $(PYTEST_ARGS)

lint: $(STAMP)
	$(VENV)/bin/ruff check .

bench: $(STAMP)
	$(PY) benchmark.py --model vit_small_patch16_224 --batch-size 32

clean:
	rm -rf $(VENV) runs .pytest_cache
