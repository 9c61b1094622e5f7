# shellcheck shell=bash
# Sourced by scripts/test and scripts/demo: what a fresh Debian machine needs
# before airlock builds and its tests run, and how to get it.

# Debian packages airlock needs. Extend this list when a test or a build
# step needs another one; both scripts install from it.
#   git              the authority repositories and the git tests
#   pkg-config, gcc, libc6-dev
#                    C toolchain for crates that build C (bundled SQLite)
#   ca-certificates  cargo fetching crates over HTTPS
#   dbus             a private dbus-daemon for the D-Bus tests
#   polkitd          real polkit decisions in the supervisor tests
#   bubblewrap       sandbox tests
#   python3          the verification commands the executor runs
#   python3-venv, python3-pip
#                    a verification environment's toolchain in the tests
#                    (a virtual environment with pytest, services/local/tests/environment.rs)
#   systemd          systemd-sysusers: airlock-local creates the package's users
#   util-linux       unshare: the executor's network namespace when not root;
#                    nsenter: the systemd testbed drives its container
#   dpkg-dev, lintian, rpm, help2man
#                    scripts/package: dpkg-shlibdeps, lintian on the .deb,
#                    rpmbuild, the daemons' man pages
#   debootstrap, systemd-container
#                    the systemd testbed (tests/systemd): a minimal Debian
#                    root, booted with systemd-nspawn
#   iproute2, libcap2-bin
#                    the escape suite: ip netns and a veth peer; setcap;
#                    the multi-host crash matrix: a network namespace per host
#   postgresql       the PostgreSQL task store's tests, the multi-host crash
#                    matrix and bench-pg: each starts a throwaway cluster with
#                    initdb/postgres from /usr/lib/postgresql/*/bin
#   openssh-client, openssh-server
#                    upstream repositories: the worker fetches and pushes
#                    over ssh; the upstream tests start a real sshd on a
#                    loopback port; ssh-keygen verifies signed commits
#   nftables         the partition tests (multi_host.rs, postgres_partition.rs):
#                    a packet filter inside a host's network namespace cuts
#                    its link to PostgreSQL
#   chromium         the systemd testbed's browser: headless, through the
#                    DevTools protocol, against Cockpit in the booted root
#                    (tests/systemd/src/cockpit_browser.py)
#   prometheus       promtool: the supervisor's metrics test checks airlock.prom
#                    with Prometheus's own parser (services/supervisor/tests/metrics.rs)
AIRLOCK_DEBIAN_PACKAGES=(git pkg-config gcc libc6-dev ca-certificates dbus polkitd bubblewrap python3 python3-venv python3-pip systemd util-linux
  dpkg-dev lintian rpm help2man debootstrap systemd-container iproute2 libcap2-bin postgresql
  openssh-client openssh-server nftables prometheus chromium tinyproxy)

# Prints a section header.
section() {
  printf '\n==> %s\n' "$*"
}

# Seconds as "42 s" or "3 min 07 s".
duration() {
  if [ "$1" -ge 60 ]; then
    printf '%d min %02d s' $(($1 / 60)) $(($1 % 60))
  else
    printf '%d s' "$1"
  fi
}

# Installs the missing packages of AIRLOCK_DEBIAN_PACKAGES: as root with
# apt-get (one `apt-get update`, then one install), otherwise it names them
# and fails. A machine without dpkg is told what it needs and left alone.
ensure_debian_packages() {
  section "Debian packages: ${AIRLOCK_DEBIAN_PACKAGES[*]}"
  if ! command -v dpkg-query >/dev/null 2>&1; then
    echo "no dpkg here; make sure these (or your distribution's equivalents) are installed: ${AIRLOCK_DEBIAN_PACKAGES[*]}"
    return 0
  fi
  local missing=() pkg
  for pkg in "${AIRLOCK_DEBIAN_PACKAGES[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q '^install ok installed$'; then
      missing+=("$pkg")
    fi
  done
  if [ ${#missing[@]} -eq 0 ]; then
    echo "all installed"
    return 0
  fi
  if [ "$(id -u)" -ne 0 ]; then
    echo "missing: ${missing[*]}" >&2
    echo "run as root, or install them first: sudo apt-get install -y --no-install-recommends ${missing[*]}" >&2
    return 1
  fi
  echo "installing: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get -o DPkg::Lock::Timeout=600 update
  apt-get -o DPkg::Lock::Timeout=600 install -y --no-install-recommends "${missing[@]}"
}

# Fails with a plain message unless cargo (Rust >= the workspace's
# rust-version, with rustfmt and clippy) is on PATH. Debian's own rustc is
# too old for edition 2024, so it is not installed from apt.
ensure_rust() {
  section "Rust toolchain"
  if ! command -v cargo >/dev/null 2>&1; then
    echo "cargo not found. Install a current Rust toolchain (https://rustup.rs), then run this again." >&2
    return 1
  fi
  cargo --version
  local component
  for component in "$@"; do
    if ! cargo "$component" --version >/dev/null 2>&1; then
      echo "cargo $component not found; with rustup: rustup component add ${component/fmt/rustfmt}" >&2
      return 1
    fi
  done
}
