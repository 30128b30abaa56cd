#!/usr/bin/env bash
# Download iproute2 (ip, tc) and the libraries it links against as Debian .debs into
# .iproute/ at the repository root (or the folder given as $1).
#
# Why: the GPU machines have no ip/tc, and nothing outside can be reached from them.
# benchmarks/emulate.py --mode capped unpacks these .debs there with `dpkg -x` into a
# private folder (never into /) and runs ip/tc with LD_LIBRARY_PATH on that folder.
# Run this on a Debian 12 machine with apt (as root), then carry .iproute/.
#
# The list is iproute2's Depends (apt-cache depends iproute2) plus their own library
# dependencies that are not on a stock Ubuntu/Debian image (libpcre2-8-0 for
# libselinux1, libmd0 for libbsd0). glibc, zlib and krb5 come from the host.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
dest="${1:-$here/../.iproute}"
packages=(iproute2 libbpf1 libelf1 libmnl0 libxtables12 libcap2 libcap2-bin libdb5.3
          libtirpc3 libbsd0 libselinux1 libmd0 libpcre2-8-0)

if ! command -v apt-get >/dev/null; then
    echo "fetch_iproute.sh: apt-get not found; run this on a Debian/Ubuntu machine" >&2
    exit 1
fi
mkdir -p "$dest"
cd "$dest"
# apt-get download needs current package lists; a fresh machine has none.
apt-get update -qq
# _apt cannot write into a root-owned folder; downloading as root is fine here.
apt-get download -o APT::Sandbox::User=root "${packages[@]}"
echo "fetch_iproute.sh: $(ls ./*.deb | wc -l) .deb files in $(pwd)"
