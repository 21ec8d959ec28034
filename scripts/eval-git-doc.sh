#!/usr/bin/env bash
# A real third-party corpus in our dev loop: Git's manual as Debian ships it
# (package git-doc: 241 HTML pages beside their AsciiDoc sources), indexed and
# evaluated with eval/git-doc.jsonl (40 questions, gold pages checked by hand).
#
#   make eval-git                       # what this runs
#   RAG_BASE_URL=http://host:8000/v1 make eval-git   # against a stack already up
#
# Uses the running stack at RAG_BASE_URL (default http://127.0.0.1:8000/v1) if it
# answers; otherwise boots `rag serve` for the run and stops it at the end.
# Results: .rag/eval/git-doc.jsonl (one line per question) and the report on stdout.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=.venv/bin
CORPORA=${RAG_CORPORA_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/rag-stack/corpora}
DEST=$CORPORA/git-doc
DOCS=$DEST/usr/share/doc/git-doc
INDEX=${RAG_GIT_DOC_INDEX:-.rag/git-doc}
URL=${RAG_BASE_URL:-http://127.0.0.1:8000/v1}

if [ ! -f "$DOCS/git-commit.html" ]; then
  echo "fetching Debian's git-doc into $DEST" >&2
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  # apt-get download needs no root, only package lists; refresh them once if they are empty.
  (cd "$tmp" && apt-get download git-doc >/dev/null 2>&1) ||
    { apt-get update -qq >/dev/null 2>&1 && (cd "$tmp" && apt-get download git-doc >/dev/null); } || {
      echo "could not download Debian's git-doc package (apt-get download git-doc); on a non-Debian" >&2
      echo "machine, extract any git-doc .deb into $DEST and run again" >&2
      exit 1
    }
  mkdir -p "$DEST"
  dpkg-deb -x "$tmp"/git-doc_*.deb "$DEST"
  echo "fetched $(basename "$tmp"/git-doc_*.deb)" >&2
fi

server=""
stop() {
  if [ -n "$server" ]; then
    kill -TERM "$server" 2>/dev/null || true
    wait "$server" 2>/dev/null || true
  fi
}
trap 'stop' EXIT
# Any HTTP reply means a stack is up: one behind an API key answers 401 here, and `rag`
# then uses the key RAG_API_KEY / RAG_API_KEY_FILE name (or says it needs one).
if [ "$(curl -s -o /dev/null -w '%{http_code}' "$URL/models")" = "000" ]; then
  port=${URL##*:}; port=${port%%/*}
  log=$(mktemp -t rag-serve.XXXXXX.log)
  echo "no stack at $URL: booting one (a few minutes on CPU; log $log)" >&2
  "$BIN/rag" serve --port "$port" >"$log" 2>&1 &
  server=$!
  for _ in $(seq 1 1800); do
    grep -q "^serving;" "$log" && break
    kill -0 "$server" 2>/dev/null || { tail -30 "$log" >&2; echo "rag serve failed (log $log)" >&2; exit 1; }
    sleep 1
  done
  grep -q "^serving;" "$log" || { echo "rag serve not up after 30 min (log $log)" >&2; exit 1; }
fi

export RAG_BASE_URL=$URL
"$BIN/rag" index "$DOCS" --index "$INDEX"
"$BIN/rag" eval eval/git-doc.jsonl --index "$INDEX" -o .rag/eval/git-doc.jsonl "$@"
