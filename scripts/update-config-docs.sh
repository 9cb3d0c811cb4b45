#!/usr/bin/env bash
# Rewrites the settings tables of docs/configuration.md from the runtime's table (weft-config
# --markdown), each after its "<!-- settings: AUDIENCE -->" marker. tests/unit/test_config.cpp
# fails when they differ.   scripts/update-config-docs.sh [BUILD_DIR]
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
config="${1:-$root/build}/weft-config"
doc="$root/docs/configuration.md"
python3 - "$config" "$doc" <<'PY'
import re, subprocess, sys
config, doc = sys.argv[1], sys.argv[2]
text = open(doc).read()
for audience in ("user", "tuning", "diagnostic"):
    table = subprocess.run([config, "--markdown", audience], check=True, capture_output=True,
                           text=True).stdout
    marker = f"<!-- settings: {audience} -->\n"
    start = text.index(marker) + len(marker)
    end = start
    while end < len(text) and text[end] == "|":
        end = text.index("\n", end) + 1
    text = text[:start] + table + text[end:]
open(doc, "w").write(text)
PY
