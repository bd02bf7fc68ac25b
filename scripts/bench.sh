#!/usr/bin/env bash
# The main job: set up, list the backends, then benchmark every available one side by side.
# Without a GPU it runs what can run (host time of the CPU backends) and says what it skipped.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
gdnzoo list
exec gdnzoo bench "$@"
