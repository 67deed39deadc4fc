#!/usr/bin/env bash
# Install the real agent CLIs the e2e tests drive into .foldgate/clients (project-local, no
# global npm state). Idempotent: does nothing when the pinned version is already there.
set -euo pipefail
cd "$(dirname "$0")/.."
CLAUDE_CODE_VERSION="2.1.328"
PREFIX=".foldgate/clients"
BIN="$PREFIX/node_modules/.bin/claude"
if [ -x "$BIN" ] && [ "$("$BIN" --version 2>/dev/null)" = "$CLAUDE_CODE_VERSION (Claude Code)" ]; then
  exit 0
fi
if ! command -v npm >/dev/null 2>&1; then
  echo "install-clients: npm not found; install Node.js 18+ and npm (apt-get install nodejs npm)" >&2
  exit 1
fi
mkdir -p "$PREFIX"
npm install --prefix "$PREFIX" --no-audit --no-fund --loglevel=error \
  "@anthropic-ai/claude-code@$CLAUDE_CODE_VERSION"
"$BIN" --version
