# mlxcel-trio developer recipes

venv := ".venv"
py := venv / "bin/python"

# list the recipes
default:
    @just --list

# create the virtualenv with the test extras
install:
    python3 -m venv {{venv}}
    {{venv}}/bin/pip install -e '.[test]'

# run the whole test suite (what CI runs)
test *ARGS:
    {{py}} -m pytest {{ARGS}}

# the fast tier (under a minute on 2 cores): tests/fast plus the unit modules that need no model
test-fast *ARGS:
    {{py}} -m pytest tests/fast tests/unit/test_bridge.py tests/unit/test_monitor.py \
        tests/unit/server tests/unit/chat --ignore tests/unit/chat/test_template.py {{ARGS}}

# the unit tier (tests/unit): pure modules and the engine on the tiny fixture checkpoint
test-unit *ARGS:
    {{py}} -m pytest tests/unit {{ARGS}}

# the end-to-end tier (tests/e2e): real server processes on 127.0.0.1
test-e2e *ARGS:
    {{py}} -m pytest tests/e2e {{ARGS}}

# serve the tiny fixture checkpoint on 127.0.0.1:8080
serve *ARGS:
    {{venv}}/bin/mlxcel-server -m "$({{py}} -m fixtures.build tiny)" {{ARGS}}

# one model across N local processes with mx.distributed (ring over loopback): just serve-distributed 2 -m PATH [--split-mode row|layer]; across machines see docs/deploy.md
serve-distributed N="2" *ARGS:
    {{venv}}/bin/mlx.launch --backend ring -n {{N}} -- {{py}} -m mlxcel_trio {{ARGS}}

# build a fixture checkpoint (tiny, tiny-4bit, bench) and print its path
fixture KIND="tiny":
    {{py}} -m fixtures.build {{KIND}}

# throughput benchmark against raw mlx-lm (not a test)
bench *ARGS:
    {{py}} bench/throughput.py {{ARGS}}

# regenerate the llama-server compatibility manifest's facts from ../shared (policy kept)
compat-extract *ARGS:
    {{py}} scripts/compat/extract_manifest.py {{ARGS}}

# validate the compatibility manifest, its claims against the code, and the doc's counts
compat-check:
    {{py}} scripts/ci/check_llama_compat_manifest.py
    {{py}} scripts/compat/claims.py
    {{py}} scripts/compat/render_counts.py --check

# run llama.cpp's server pytest suite (SUITE = its tools/server/tests) on a local checkpoint: --server BIN --model PATH [--python PY] [--junit FILE] [-- PYTEST_ARGS]
conformance SUITE *ARGS:
    {{py}} scripts/conformance/upstream_suite.py {{SUITE}} {{ARGS}}
