#!/usr/bin/env bash
# Makes sure Debian's Chromium is at /usr/bin/chromium for the browser tests (tests/web).
# Installs it with apt-get when it is missing and we may (root, or passwordless sudo). Never fails
# the build: without a browser the e2e tests skip and say why; this prints why loudly first.
set -u

CHROMIUM=/usr/bin/chromium

if [ -x "$CHROMIUM" ]; then
  exit 0
fi

shout() {
  echo "!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!" >&2
  echo "!!! $*" >&2
  echo "!!! The browser tests (tests/web, marker e2e) will be SKIPPED." >&2
  echo "!!! Install Debian's Chromium (apt-get install chromium) and run make test again." >&2
  echo "!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!" >&2
}

if ! command -v apt-get >/dev/null 2>&1; then
  shout "$CHROMIUM is missing and this machine has no apt-get to install it."
  exit 0
fi

if [ "$(id -u)" -eq 0 ]; then
  as_root=()
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
  as_root=(sudo -n)
else
  shout "$CHROMIUM is missing and installing it needs root (or passwordless sudo)."
  exit 0
fi

echo "installing Debian's chromium for the browser tests (apt-get)..." >&2
export DEBIAN_FRONTEND=noninteractive
if "${as_root[@]}" apt-get update -qq \
  && "${as_root[@]}" apt-get install -y -qq chromium fonts-liberation >/dev/null; then
  echo "installed: $("$CHROMIUM" --version 2>/dev/null)" >&2
else
  shout "apt-get could not install chromium."
fi
exit 0
