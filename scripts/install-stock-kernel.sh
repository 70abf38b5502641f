#!/bin/bash
# Installs Debian's trixie-backports kernel (7.x: rdma_rxe works inside network namespaces from 7.1; sch_netem and
# openvswitch as modules) for the stock-kernel tier, without touching the system's apt sources: a private sources
# list, lists and cache under $CACHE, `apt-get download` of the three packages, `dpkg -i`. Debian only; idempotent.
# Which 7.x: the newest trixie-backports lists (scripts/stock_kernel.py reads apt-cache's answer), since backports
# drops old ones; STOCK_KERNEL_VERSION=7.3.4+deb13-amd64 (or the first argument) names one instead. Any 7.x stock
# kernel already installed is kept. The release installed is printed and written to $CACHE/installed-release.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
KVER="${1:-${STOCK_KERNEL_VERSION:-}}"
CACHE="${CACHE:-/var/cache/testbed-kernel}"
if [ -n "$KVER" ] && [ -e "/usr/lib/modules/$KVER/vmlinuz" ]; then echo "stock kernel $KVER: present"; exit 0; fi
if [ -z "$KVER" ]; then
  present=$(for image in /usr/lib/modules/7.*/vmlinuz; do
              r=${image%/vmlinuz}; r=${r##*/}
              if [ -e "$image" ] && [ "$r" != "$(uname -r)" ]; then echo "$r"; fi
            done | sort -V | tail -n 1)
  if [ -n "$present" ]; then echo "stock kernel $present: present"; exit 0; fi
fi
WHICH="${KVER:-(the newest 7.x in trixie-backports)}"
if [ "$(id -u)" != 0 ]; then echo "installing the stock kernel $WHICH needs root: run 'sudo make install'" >&2; exit 1; fi
. /etc/os-release
if [ "$ID" != debian ]; then
  echo "stock kernel $WHICH: not installed ($ID has no trixie-backports; the tier boots the distribution's kernel, where rxe cannot work in a namespace before 7.1)"; exit 0
fi
mkdir -p "$CACHE/lists/partial" "$CACHE/archives/partial"
cat > "$CACHE/sources.list" <<SRC
deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian trixie-backports main
SRC
opts=(-o "Dir::Etc::sourcelist=$CACHE/sources.list" -o "Dir::Etc::sourceparts=-" -o "Dir::State::Lists=$CACHE/lists"
      -o "Dir::Cache=$CACHE" -o "APT::Get::List-Cleanup=0")
apt-get -q "${opts[@]}" update
if [ -z "$KVER" ]; then
  KVER=$(apt-cache "${opts[@]}" search --names-only '^linux-binary-7\.' | python3 "$HERE/stock_kernel.py")
  echo "stock kernel: the newest 7.x in trixie-backports is $KVER"
fi
cd "$CACHE/archives"
apt-get -q "${opts[@]}" download "linux-binary-$KVER" "linux-modules-$KVER" "linux-base-$KVER"
dpkg -i "$CACHE"/archives/linux-{base,modules,binary}-"$KVER"_*.deb
test -e "/usr/lib/modules/$KVER/vmlinuz"
echo "$KVER" > "$CACHE/installed-release"
echo "stock kernel $KVER: installed"
