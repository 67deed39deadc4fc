#!/usr/bin/env bash
# A virtual environment of its own for the LiteLLM proxy that bench/overhead.py --peers
# measures beside foldgate (.litellm-venv, or the folder given as $1).
#
# Why not `pip install 'litellm[proxy]'` into the gateway's venv: the extra pulls ~35
# packages (polars, mcp, azure-*, fastapi-sso, granian, ...) and pins starlette, fastapi and
# pydantic ranges of its own, and its `litellm-proxy==<version>` requirement is not on every
# index (it was not on this project's). This installs the same litellm the dev extra pins
# plus the proxy's runtime requirements from litellm's own metadata, minus that package.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${1:-.litellm-venv}
python=${PYTHON:-python3.11}
[ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
"$venv/bin/pip" install -q 'litellm==1.110.2' \
  'backoff>=2.2.1' 'uvicorn>=0.33' 'uvloop>=0.22.1' 'fastapi>=0.136.3' 'starlette>=1.0.1' \
  'pyyaml>=6.0.3' 'rq>=2.7' 'orjson>=3.12' 'hiredis>=3.5' 'apscheduler>=3.11.2' \
  'fastapi-sso>=0.19' 'pyjwt>=2.13' 'python-multipart>=0.0.27' 'cryptography>=49' \
  'pynacl>=1.6.2' 'websockets>=15.0.1,<16' 'semver>=3.0.4' 'redis' 'gunicorn>=23,<24' \
  'restrictedpython>=8.5,<9' 'expression>=5.6,<6' 'soundfile>=0.12.1' 'mcp>=2.3,<3' 'tomlkit>=0.13.3' 'rich>=13.9.4,<14'
LITELLM_LOCAL_MODEL_COST_MAP=True "$venv/bin/python" -c "import litellm.proxy.proxy_server" \
  && echo "LiteLLM proxy ready: $venv/bin/litellm"
