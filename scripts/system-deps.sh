#!/usr/bin/env bash
# Installs the Debian packages roomstream needs, only when missing. Idempotent, non-interactive.
#   libpostgresql-jdbc-java : PostgreSQL JDBC driver for Spark (no Maven downloads at run time)
#   openjdk-17-jre-headless : the JVM PySpark runs on
#   chromium                : the browser the web-client tests (tests/web) drive through Playwright
set -euo pipefail
needed=()
for pkg in libpostgresql-jdbc-java openjdk-17-jre-headless chromium; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || needed+=("$pkg")
done
if [ ${#needed[@]} -gt 0 ]; then
  echo "installing Debian packages: ${needed[*]}"
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -qq
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${needed[@]}"
fi
