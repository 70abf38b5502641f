#!/bin/bash
# Installs Debian's trixie-backports kernel (7.x: rdma_rxe works inside network namespaces from 7.1; sch_netem and
# openvswitch as modules) for the stock-kernel tier, without touching the system's apt sources: a private sources
# list, lists and cache under $CACHE, `apt-get download` of the three packages, `dpkg -i`. Debian only; idempotent.
set -euo pipefail
KVER="${1:-7.3.4+deb13-amd64}"
CACHE="${CACHE:-/var/cache/testbed-kernel}"
if [ -e "/usr/lib/modules/$KVER/vmlinuz" ]; then echo "stock kernel $KVER: present"; exit 0; fi
if [ "$(id -u)" != 0 ]; then echo "installing the stock kernel $KVER needs root: run 'sudo make install'" >&2; exit 1; fi
. /etc/os-release
if [ "$ID" != debian ]; then
  echo "stock kernel $KVER: not installed ($ID has no trixie-backports; the tier boots the distribution's kernel, where rxe cannot work in a namespace before 7.1)"; exit 0
fi
mkdir -p "$CACHE/lists/partial" "$CACHE/archives/partial"
cat > "$CACHE/sources.list" <<SRC
deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian trixie-backports main
SRC
opts=(-o "Dir::Etc::sourcelist=$CACHE/sources.list" -o "Dir::Etc::sourceparts=-" -o "Dir::State::Lists=$CACHE/lists"
      -o "Dir::Cache=$CACHE" -o "APT::Get::List-Cleanup=0")
apt-get -q "${opts[@]}" update
cd "$CACHE/archives"
apt-get -q "${opts[@]}" download "linux-binary-$KVER" "linux-modules-$KVER" "linux-base-$KVER"
dpkg -i "$CACHE"/archives/linux-{base,modules,binary}-"$KVER"_*.deb
test -e "/usr/lib/modules/$KVER/vmlinuz"
echo "stock kernel $KVER: installed"
