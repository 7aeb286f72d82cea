#!/usr/bin/env bash
# Installs the browser the report's browser tests drive (tests/test_report_browser.py): Debian's
# `chromium` package, when /usr/bin/chromium is missing. Run by `make test` (and so by .ci/run);
# Playwright's own browser download is not used (it cannot reach its download host here).
# Needs root (CI runs as root) or sudo.
set -euo pipefail
if [ -x /usr/bin/chromium ]; then
  exit 0
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  SUDO="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
echo "installing Debian's chromium for the report browser tests" >&2
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq chromium >/dev/null
test -x /usr/bin/chromium
