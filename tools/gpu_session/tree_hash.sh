#!/usr/bin/env bash
# A short hash of the code that runs (cudal2/, rl/, scripts/, tools/, tests/ sources), so a report can be
# tied to a commit even where .git is missing or stale (the device machine's copy of .git may
# not be the working tree it runs). Same command on both machines: compare the two.
set -euo pipefail
cd "${1:-$(dirname "$0")/../..}"
find cudal2 rl scripts tools tests -type f \( -name '*.py' -o -name '*.sh' -o -name '*.cu' -o -name '*.cuh' -o -name '*.c' \) \
  -not -path '*/__pycache__/*' -print0 | LC_ALL=C sort -z | xargs -0 sha256sum | sha256sum | cut -c1-16
