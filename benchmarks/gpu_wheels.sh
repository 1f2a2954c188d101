#!/usr/bin/env bash
# The serve workload's packages for the lent GPU machine, as wheels in .whl/ (ignored by git).
#
# The device image has torch, httpx, anyio, h11, click and annotated-doc, but not FastAPI, Starlette,
# uvicorn or pydantic, so `make gpu-check` skips its `serve` step there (issue 54). pip works here and not
# there: this fetches, for CPython 3.12 on x86-64 (the image's python3), the versions this checkout's
# .venv runs, each without its dependencies (those the image lacks are named here too). Then `run` with
# carry [".whl"] and the command in benchmarks/README.md ("The serve step on a lent GPU").
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
# The image holds anyio, h11, click, annotated-doc, httpx (KINDS.md's package list).
NAMES="fastapi starlette uvicorn pydantic pydantic-core annotated-types typing-inspection opentelemetry-api typing-extensions"
rm -rf .whl && mkdir -p .whl
for name in $NAMES; do
  version=$("$PY" -m pip show "$name" 2>/dev/null | sed -n 's/^Version: //p')
  if [ -z "$version" ]; then
    echo "gpu_wheels: $name is not installed in $PY: run 'make setup' first (it installs the serve extra)" >&2
    exit 2
  fi
  "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d .whl "$name==$version" 2>&1 | grep -v "is ignored: it is neither" || true
done
n=$(ls .whl/*.whl | wc -l)
echo "gpu_wheels: $n wheels, $(du -sh .whl | cut -f1) in .whl/ (carry: [\".whl\"])"
