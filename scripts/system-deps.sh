#!/usr/bin/env bash
# Installs the system packages some tests use, when missing: Chromium (browser end-to-end
# tests), a CJK font (the page in Japanese), espeak-ng (voice synthesis), nftables (NAT routers)
# and Prometheus (the metrics test scrapes a live node). Uses Debian's packages; needs root and apt-get.
# Idempotent and quiet; where it cannot install, the tests that need a package skip and say why.
set -uo pipefail

missing=()
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
command -v espeak-ng >/dev/null 2>&1 || missing+=(espeak-ng)
# Japanese on the page (its screenshots and the Japanese browser test) needs a CJK font
fc-list :lang=ja 2>/dev/null | grep -q . || missing+=(fonts-noto-cjk)
command -v nft >/dev/null 2>&1 || missing+=(nftables)  # NAT routers of the network-namespace tests
command -v prometheus >/dev/null 2>&1 || missing+=(prometheus)  # tests/integration/test_metrics_prometheus.py
[ ${#missing[@]} -eq 0 ] && exit 0

if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "system-deps: cannot install ${missing[*]} (needs root and apt-get); tests that need them will skip" >&2
    exit 0
fi
echo "system-deps: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >/dev/null 2>&1 || true
if ! apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null 2>&1; then
    echo "system-deps: apt-get could not install ${missing[*]}; tests that need them will skip" >&2
fi
exit 0
