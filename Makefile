# Two commands on a fresh machine: `make train` and `make test`. Both create .venv when it is missing and install
# the exact versions in constraints.txt (pyproject.toml itself only has lower bounds).
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
PYTEST_ARGS ?=
# The suite runs in one pytest-xdist worker per core (at most 4), each pinned to its core (tests/conftest.py), a
# whole test file per worker so that a file's fixtures are made once. JOBS=0 runs it in this one process.
JOBS ?= $(shell n=$$(nproc 2>/dev/null || echo 1); echo $$((n < 4 ? n : 4)))
XDIST := $(if $(filter 0,$(JOBS)),,-n $(JOBS) --dist loadfile)

.PHONY: setup browser train test test-fast lint bench clean

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -c constraints.txt -e '.[dev,export,openvino,wds,hf,track,peft]'
	touch $(STAMP)

setup: $(STAMP)

# tests/test_demo.py drives demo.py in Debian's chromium; as root without it, install it (~1 min here). Only the
# tests need it, so `make train` does not wait for it.
browser:
	@if [ ! -x /usr/bin/chromedriver ] && [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver; fi

# One process needs no launcher: train.py runs under Accelerate on its own and picks the same threads and loader
# workers as `accelerate launch` would (vit/cli/runtime.py), so the numbers are the same; the launcher's own start
# (~5 s here) would be 5% of the main job. Several processes or GPUs: `accelerate launch -q ... train.py`.
train: $(STAMP)
	$(PY) train.py $(ARGS)

test: $(STAMP) browser
	$(PY) -m pytest -q --durations=25 $(XDIST) $(PYTEST_ARGS)

test-fast: $(STAMP) browser
	$(PY) -m pytest -q -m "not slow" $(XDIST) $(PYTEST_ARGS)

lint: $(STAMP)
	$(VENV)/bin/ruff check .

bench: $(STAMP)
	$(PY) benchmark.py --model vit_small_patch16_224 --batch-size 32

clean:
	rm -rf $(VENV) runs .pytest_cache
