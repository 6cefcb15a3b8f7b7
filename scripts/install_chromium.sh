#!/usr/bin/env bash
# Install Debian's Chromium and the fonts the synthetic web pages use (idempotent).
#
#   bash scripts/install_chromium.sh        -> chromium on PATH, fonts-dejavu-core + fonts-liberation
#
# Needed by data_pipelines/web (page rendering) and eval/web_metric (the Design2Code metric), and by their
# tests in tests/web (which fail, not skip, without a browser). Returns at once when everything is present.
# Runs apt-get as root, or through sudo when that exists. Set KVL_CHROMIUM to use another Chromium/Chrome.
set -euo pipefail

have_fonts() {
  command -v fc-list >/dev/null 2>&1 && fc-list : family | grep -q "DejaVu Sans" && fc-list : family | grep -q "Liberation Sans"
}

if command -v chromium >/dev/null 2>&1 && have_fonts; then
  echo "[install_chromium] present: $(chromium --version 2>/dev/null | head -n1)"
  exit 0
fi

if [ "$(id -u)" -eq 0 ]; then
  SUDO=""
elif command -v sudo >/dev/null 2>&1; then
  SUDO="sudo"
else
  echo "[install_chromium] need root or sudo to run: apt-get install -y chromium fonts-dejavu-core fonts-liberation" >&2
  exit 1
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "[install_chromium] no apt-get here: install Chromium with your package manager and set KVL_CHROMIUM" >&2
  exit 1
fi

export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends chromium fonts-dejavu-core fonts-liberation fontconfig
echo "[install_chromium] installed: $(chromium --version 2>/dev/null | head -n1)"
