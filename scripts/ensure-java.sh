#!/usr/bin/env bash
# Makes sure a Java runtime is on PATH for the Spark tests (tests/trainyard/test_spark.py: a
# local Spark session runs in a JVM). Installs Debian's default-jre-headless with apt-get when
# java is missing and we may (root, or passwordless sudo). Never fails the build: without Java
# the Spark tests skip and say why; this prints why loudly first.
set -u

if command -v java >/dev/null 2>&1; then
  exit 0
fi

shout() {
  echo "!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!" >&2
  echo "!!! $*" >&2
  echo "!!! The Spark tests (tests/trainyard/test_spark.py) will be SKIPPED." >&2
  echo "!!! Install a Java runtime (apt-get install default-jre-headless) and run make test." >&2
  echo "!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!" >&2
}

if ! command -v apt-get >/dev/null 2>&1; then
  shout "java is missing and this machine has no apt-get to install it."
  exit 0
fi

if [ "$(id -u)" -eq 0 ]; then
  as_root=()
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
  as_root=(sudo -n)
else
  shout "java is missing and installing it needs root (or passwordless sudo)."
  exit 0
fi

echo "installing Debian's default-jre-headless for the Spark tests (apt-get)..." >&2
export DEBIAN_FRONTEND=noninteractive
if "${as_root[@]}" apt-get update -qq \
  && "${as_root[@]}" apt-get install -y -qq default-jre-headless >/dev/null; then
  echo "installed: $(java -version 2>&1 | head -1)" >&2
else
  shout "apt-get could not install default-jre-headless."
fi
exit 0
