# make demo / make test create the environment (.venv, Horovod built once per user) when needed.
VENV ?= .venv
PY := $(VENV)/bin/python
READY := $(VENV)/.horovod-hetero-ready
NP ?= 4

.PHONY: demo test test-single test-parallel bench bench-wagma env clean

$(READY): tools/bootstrap.sh tools/requirements.txt setup.py
	VENV=$(VENV) bash tools/bootstrap.sh

env: $(READY)

demo: $(READY)
	$(PY) -m horovod_hetero.cli demo

test: test-single test-parallel

test-single: $(READY)
	$(PY) -m pytest -q -p no:cacheprovider tests/single

test-parallel: $(READY)
	@# one horovodrun job per file: test_torch_bitwise.py turns tensor fusion off for its whole job
	@# test_wagma*.py register WAGMA's process sets in hvd.init, once per job
	for f in tests/parallel/test_torch.py tests/parallel/test_torch_bitwise.py tests/parallel/test_esync.py \
	         tests/parallel/test_keras.py tests/parallel/test_wagma.py tests/parallel/test_keras_wagma.py; do \
	  VENV=$(VENV) tools/run_parallel.sh $(NP) $$f || exit 1; done

bench: $(READY)
	$(VENV)/bin/horovodrun -np 2 -H localhost:2 --gloo $(PY) benchmarks/averaging_cost.py

bench-wagma: $(READY)
	PYTHONPATH=. $(VENV)/bin/horovodrun -np 4 -H localhost:4 --gloo $(PY) benchmarks/wagma.py

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
