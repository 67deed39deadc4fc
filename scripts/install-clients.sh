#!/usr/bin/env bash
# Install the real agent CLIs the e2e tests drive into .foldgate/clients (project-local, no
# global npm state): Claude Code (Anthropic Messages) and Codex (OpenAI Responses).
# Idempotent: does nothing when the pinned versions are already there.
set -euo pipefail
cd "$(dirname "$0")/.."
CLAUDE_CODE_VERSION="2.1.328"
CODEX_VERSION="0.169.0"
PREFIX=".foldgate/clients"
CLAUDE="$PREFIX/node_modules/.bin/claude"
CODEX="$PREFIX/node_modules/.bin/codex"
if [ -x "$CLAUDE" ] && [ "$("$CLAUDE" --version 2>/dev/null)" = "$CLAUDE_CODE_VERSION (Claude Code)" ] \
  && [ -x "$CODEX" ] && [ "$("$CODEX" --version 2>/dev/null)" = "codex-cli $CODEX_VERSION" ]; then
  exit 0
fi
if ! command -v npm >/dev/null 2>&1; then
  echo "install-clients: npm not found; install Node.js 18+ and npm (apt-get install nodejs npm)" >&2
  exit 1
fi
mkdir -p "$PREFIX"
npm install --prefix "$PREFIX" --no-audit --no-fund --loglevel=error \
  "@anthropic-ai/claude-code@$CLAUDE_CODE_VERSION" "@openai/codex@$CODEX_VERSION"
"$CLAUDE" --version
"$CODEX" --version
