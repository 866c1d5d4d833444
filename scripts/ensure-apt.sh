#!/usr/bin/env bash
# Makes sure a program some tests need is present; installs its Debian packages with apt-get when
# it is missing and we may (root, or passwordless sudo). Never fails the build: without it those
# tests skip and say why; this prints why loudly first.
#   scripts/ensure-apt.sh PROGRAM "PACKAGES" "WHICH TESTS"
# `make test` runs it for Chromium (the browser tests, tests/web) and Java (the Spark tests).
set -u

program=$1
packages=$2
tests=$3

if command -v "$program" >/dev/null 2>&1; then
  exit 0
fi

shout() {
  echo "!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!" >&2
  echo "!!! $*" >&2
  echo "!!! $tests will be SKIPPED." >&2
  echo "!!! Install it (apt-get install $packages) and run make test again." >&2
  echo "!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!" >&2
}

if ! command -v apt-get >/dev/null 2>&1; then
  shout "$program is missing and this machine has no apt-get to install it."
  exit 0
fi

if [ "$(id -u)" -eq 0 ]; then
  as_root=()
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
  as_root=(sudo -n)
else
  shout "$program is missing and installing it needs root (or passwordless sudo)."
  exit 0
fi

echo "installing $packages for $tests (apt-get)..." >&2
export DEBIAN_FRONTEND=noninteractive
# shellcheck disable=SC2086  # the packages are a word list
if "${as_root[@]}" apt-get update -qq \
  && "${as_root[@]}" apt-get install -y -qq $packages >/dev/null; then
  echo "installed: $(command -v "$program")" >&2
else
  shout "apt-get could not install $packages."
fi
exit 0
