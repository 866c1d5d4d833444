#!/usr/bin/env bash
# Makes sure a program some tests need is present; installs its Debian packages with apt-get when
# it is missing and we may (root, or passwordless sudo). Outside CI it never fails the build:
# without it those tests skip and say why; this prints why loudly first. Under CI=true a program
# it cannot provide fails the build (exit 1): CI must not stay green by skipping a real component.
#   scripts/ensure-apt.sh PROGRAM "PACKAGES" "WHICH TESTS"
# `make test` runs it for Chromium (the browser tests, tests/web) and Java (the Spark tests).
set -u

program=$1
packages=$2
tests=$3

if command -v "$program" >/dev/null 2>&1; then
  exit 0
fi

in_ci=false
if [ "${CI:-}" = "true" ]; then
  in_ci=true
fi

# Says why the program is missing, loudly; then the build goes on without it (its tests skip),
# or, under CI=true, stops here.
give_up() {
  echo "!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!" >&2
  echo "!!! $*" >&2
  if $in_ci; then
    echo "!!! error: CI=true, and $tests need it: a missing component fails CI." >&2
  else
    echo "!!! $tests will be SKIPPED." >&2
  fi
  echo "!!! Install it (apt-get install $packages) and run make test again." >&2
  echo "!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!" >&2
  if $in_ci; then
    exit 1
  fi
  exit 0
}

if ! command -v apt-get >/dev/null 2>&1; then
  give_up "$program is missing and this machine has no apt-get to install it."
fi

if [ "$(id -u)" -eq 0 ]; then
  as_root=()
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
  as_root=(sudo -n)
else
  give_up "$program is missing and installing it needs root (or passwordless sudo)."
fi

echo "installing $packages for $tests (apt-get)..." >&2
export DEBIAN_FRONTEND=noninteractive
# shellcheck disable=SC2086  # the packages are a word list
if "${as_root[@]}" apt-get update -qq \
  && "${as_root[@]}" apt-get install -y -qq $packages >/dev/null \
  && command -v "$program" >/dev/null 2>&1; then
  echo "installed: $(command -v "$program")" >&2
  exit 0
fi
give_up "apt-get could not install $packages (or they did not provide $program)."
